"""Who holds what in a store: its lock, the runs in flight, the cases they claimed.

    with owners.locked(exp_dir):          # read-modify-write of the manifest, compaction
        ...
    owners.register(exp_dir, run_id)      # .runs/<run_id>: this run is in flight
    owners.live_runs(exp_dir)             # the run_ids whose owner is alive
    mine = owners.claim(exp_dir, ids, run_id)   # claims/<case_id>: computing these now
    owners.release(exp_dir, mine)
    owners.tidy(exp_dir)                  # remove what dead owners left behind

Several runs and shards may write one store at once (a second terminal, a SLURM array on
a shared file system). They coordinate through files in the store only:

- the lock, `.lock`: an flock on it (fcntl; the kernel drops it when its holder dies, so
  a lock is never left stale); re-entrant within a process. `.compact.lock`, the
  earlier lock protocol's file, is removed by `tidy` when empty or its owner is dead.
- the owner of a file is "host pid start" (start: the process's start time in clock
  ticks since boot, from /proc, so that a reused pid is not taken for its dead owner).
  On this host an owner is alive while its process is; on another host while its run's
  heartbeat (the mtime of .runs/<run_id>, touched every HEARTBEAT_S by the run) is
  younger than STALE_S.
- a claim, claims/<case_id>, is created with link(2), which fails when the name exists:
  of two runs asking for one case exactly one gets it. A claim whose owner is dead is
  taken over. So a case is computed twice only while its first owner is still in flight.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import socket
import stat
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from flashnum.store.errors import unreadable

LOCK = ".lock"
OLD_LOCK = ".compact.lock"
RUNS = ".runs"
CLAIMS = "claims"
HEARTBEAT_S = 60.0
STALE_S = 600.0  # an owner on another host whose heartbeat is older than this is dead

_held: dict[str, list] = {}  # lock path -> [fd, depth]: the lock is re-entrant per process


def host() -> str:
    return socket.gethostname()


def _start_time(pid: int) -> str:
    """The process's start time (clock ticks after boot), or "0" where /proc has none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "0"
    return text.rsplit(")", 1)[1].split()[19]  # field 22, counted after the command name


def me(run_id: str = "-") -> str:
    """This process as an owner: 'host pid start run_id'."""
    pid = os.getpid()
    return f"{host()} {pid} {_start_time(pid)} {run_id}"


def _pid_alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return True  # no /proc: the pid exists, take it for its owner
    return fields[0] != "Z" and start in ("0", fields[19])  # a zombie has exited


def alive(owner: str, exp_dir: Path | None = None) -> bool:
    """Whether the owner 'host pid start run_id' is still running (see the docstring)."""
    try:
        h, pid, start, run_id = owner.split()
        pid = int(pid)
    except ValueError:
        return False  # empty or garbage: nothing alive wrote it (owners are written whole)
    if h == host():
        return _pid_alive(pid, start)
    if exp_dir is None or run_id == "-":
        return True  # another host, nothing to ask: assume it runs
    beat = Path(exp_dir) / RUNS / run_id
    try:
        return time.time() - beat.stat().st_mtime < STALE_S
    except FileNotFoundError:
        return False


def _owner_line(text: str) -> bool:
    """Whether text is an owner as some flashnum wrote it: 'host pid [start [run_id]]'."""
    f = text.split()
    return 2 <= len(f) <= 4 and f[1].isdigit() and (len(f) < 3 or f[2].isdigit())


def read_owner(path: Path) -> str | None:
    """The owner a claim or run mark names; None when it is gone. StoreError (one line, the
    repair) for what flashnum never writes there: not a regular file, not UTF-8 text, not
    an owner line (flashnum writes them whole, with link(2))."""
    path = Path(path)
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode):
            raise unreadable(path, "not a file flashnum writes: "
                             + ("a folder" if stat.S_ISDIR(st.st_mode) else "a link or device"))
        text = path.read_bytes().decode("utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except UnicodeDecodeError:
        raise unreadable(path, "not an owner: not UTF-8 text") from None
    except OSError as e:
        raise unreadable(path, f"{type(e).__name__}: {e.strerror}") from None
    if not _owner_line(text):
        raise unreadable(path, f"not an owner (host pid start run_id): {text[:40]!r}")
    return text


def foreign(exp_dir) -> list[tuple[Path, str]]:
    """What the owners' files hold that flashnum never writes, with why: a lock that is not
    a regular file, claims/ or .runs/ that are not folders, entries of them that read_owner
    refuses. `python -m flashnum.stored check` lists them, `repair` quarantines them, and
    a run refuses to start on them (tidy)."""
    exp_dir = Path(exp_dir)
    out = []
    for lock in (exp_dir / LOCK, exp_dir / OLD_LOCK):
        if lock.is_symlink() or (lock.exists() and not lock.is_file()):
            out.append((lock, "not a lock file: " + ("a link" if lock.is_symlink() else
                                                       "a folder or device")))
    for d in (exp_dir / CLAIMS, exp_dir / RUNS):
        if d.is_symlink() or (d.exists() and not d.is_dir()):
            out.append((d, "not a folder"))
            continue
        if d.is_dir():
            for f in sorted(d.iterdir()):
                if f.name.startswith("."):
                    continue
                try:
                    read_owner(f)
                except Exception as e:  # StoreError: its why
                    out.append((f, getattr(e, "why", None) or str(e)))
    return out


# -- the lock ------------------------------------------------------------------------


@contextmanager
def locked(exp_dir):
    """Hold the store's lock (blocking): one writer of the manifest or the table at a time."""
    path = str(Path(exp_dir) / LOCK)
    if path in _held:
        _held[path][1] += 1
        try:
            yield
        finally:
            _held[path][1] -= 1
        return
    Path(exp_dir).mkdir(parents=True, exist_ok=True)
    try:  # never through a link, never a folder: a lock is a plain file of the store's own
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        if e.errno in (errno.EISDIR, errno.ELOOP):
            raise unreadable(Path(path), "not a lock file: a folder or a link") from None
        raise
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:  # a file system without flock (Lustre mounted without it)
            if e.errno not in (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL):
                raise
            fcntl.lockf(fd, fcntl.LOCK_EX)  # POSIX record locks: NFS and Lustre's localflock
        _held[path] = [fd, 1]
        try:
            yield
        finally:
            del _held[path]
    finally:
        os.close(fd)  # closing drops the lock


# -- runs in flight --------------------------------------------------------------------


def _write_new(path: Path, text: str) -> bool:
    """Create `path` holding `text`, whole, unless it exists (link(2) is atomic)."""
    tmp = path.parent / f".tmp-{tag()}-{path.name}"
    tmp.write_text(text)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def register(exp_dir, run_id: str) -> threading.Event:
    """Mark run_id in flight (.runs/<run_id>) and keep its heartbeat; set() the returned
    event to stop the heartbeat (then unregister)."""
    d = Path(exp_dir) / RUNS
    d.mkdir(parents=True, exist_ok=True)
    path = d / run_id
    _write_new(path, me(run_id))
    stop = threading.Event()

    def beat():
        while not stop.wait(HEARTBEAT_S):
            try:
                os.utime(path)
            except OSError:
                return

    threading.Thread(target=beat, daemon=True, name="flashnum-heartbeat").start()
    return stop


def unregister(exp_dir, run_id: str, stop: threading.Event | None = None) -> None:
    if stop is not None:
        stop.set()
    (Path(exp_dir) / RUNS / run_id).unlink(missing_ok=True)


def run_owner(exp_dir, run_id: str) -> str | None:
    return read_owner(Path(exp_dir) / RUNS / run_id)


def run_alive(exp_dir, run_id: str) -> bool:
    owner = run_owner(exp_dir, run_id)
    return owner is not None and alive(owner, exp_dir)


def live_runs(exp_dir) -> set[str]:
    d = Path(exp_dir) / RUNS
    if not d.is_dir():
        return set()
    return {f.name for f in d.iterdir() if not f.name.startswith(".")
            and run_alive(exp_dir, f.name)}


# -- claims ----------------------------------------------------------------------------


def _claim_path(exp_dir, case_id: str) -> Path:
    safe = case_id if case_id.replace("_", "").isalnum() else hashlib.sha1(
        case_id.encode()).hexdigest()
    return Path(exp_dir) / CLAIMS / safe


def claim(exp_dir, case_ids, run_id: str) -> list[str]:
    """The case_ids this process now owns: the rest are claimed by a live owner."""
    (Path(exp_dir) / CLAIMS).mkdir(parents=True, exist_ok=True)
    owner, mine = me(run_id), []
    for cid in case_ids:
        path = _claim_path(exp_dir, cid)
        for _ in range(3):
            if _write_new(path, owner):
                mine.append(cid)
                break
            held = read_owner(path)
            if held is None:
                continue  # released meanwhile: try again
            if alive(held, exp_dir):
                break
            _take_stale(path, held)
    return mine


def _take_stale(path: Path, held: str) -> None:
    """Remove a dead owner's file, unless another process replaced it meanwhile."""
    aside = path.parent / f".stale-{uuid.uuid4().hex}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    if aside.read_bytes() != held.encode():  # not the file judged stale: put it back
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
    aside.unlink(missing_ok=True)


def release(exp_dir, case_ids) -> None:
    for cid in case_ids:
        _claim_path(exp_dir, cid).unlink(missing_ok=True)


# -- what dead owners leave ----------------------------------------------------------


def tag() -> str:
    """The owner part of a temporary file's name: a host hash, the pid, a random part."""
    h = hashlib.sha1(host().encode()).hexdigest()[:8]
    return f"{h}-{os.getpid()}-{_start_time(os.getpid())}-{uuid.uuid4().hex[:12]}"


def _tmp_stale(path: Path, now: float) -> bool:
    """A `.tmp-*` file is stale when its writer (named in it) is dead; a name of the
    earlier form, or one from another host, after STALE_S."""
    parts = path.name.split("-")
    h = hashlib.sha1(host().encode()).hexdigest()[:8]
    if len(parts) > 4 and parts[1] == h and parts[2].isdigit():
        return not _pid_alive(int(parts[2]), parts[3])
    try:
        return now - path.stat().st_mtime > STALE_S
    except FileNotFoundError:
        return False


def _age(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except FileNotFoundError:
        return -1.0


def stale(exp_dir) -> list[tuple[Path, str | None]]:
    """What dead owners left: temporary files, claims, run marks, an old-style lock;
    each with the owner it names (claims and run marks), to be taken away only if
    unchanged (another process may take a dead owner's claim over meanwhile)."""
    exp_dir = Path(exp_dir)
    now, out = time.time(), []
    for d in (exp_dir, exp_dir / "parts", exp_dir / CLAIMS, exp_dir / RUNS):
        if d.is_dir():  # only plain files: nothing of flashnum's is a folder named so
            out += [(f, None) for f in d.glob(".tmp-*") if _plain(f) and _tmp_stale(f, now)]
            out += [(f, None) for f in d.glob(".stale-*") if _plain(f) and _age(f, now) > 60]
    for d in (exp_dir / CLAIMS, exp_dir / RUNS):
        if d.is_dir():
            for f in d.iterdir():
                if not f.name.startswith("."):
                    held = read_owner(f)
                    if held is not None and not alive(held, exp_dir):
                        out.append((f, held))
    old = exp_dir / OLD_LOCK
    if _plain(old):
        try:
            h, pid = old.read_text().split()
            dead = h == host() and not _pid_alive(int(pid), "0")
        except (ValueError, OSError):
            dead = True  # empty: a crash between creating and writing it
        if dead:
            out.append((old, None))
    return out


def _plain(f: Path) -> bool:
    return f.is_file() and not f.is_symlink()


def tidy(exp_dir) -> list[Path]:
    """Remove what `stale` finds; returns what was removed (nothing on a read-only store).
    StoreError (one line, the repair) first if the owners' files hold anything `foreign`."""
    bad = foreign(exp_dir)
    if bad:
        raise unreadable(*bad[0])
    removed = []
    for f, held in stale(exp_dir):
        try:
            if held is None:
                f.unlink()
            else:
                _take_stale(f, held)
            removed.append(f)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                return removed  # a read-only store: leave it as it is
            raise
    return removed
