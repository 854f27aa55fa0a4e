"""The one command-line convention of every `python -m flashnum.<command>`.

Every command takes Hydra's `key=value` overrides (the same grammar as
`python -m flashnum.run`: dotted keys, lists [a,b], +key=value for open mappings),
stops a bad value before any work with one line on stderr and exit status 2,
and writes into the one store (flashnum.store, root `store.root=`).

A command other than run declares its options as a dataclass and calls main_of:

    @dataclass
    class Args:
        what: str = "all"
        quick: bool = False
        store: StoreConf = field(default_factory=StoreConf)

    def main(argv=None) -> int:
        return main_of("flashnum.reproduce", Args, _run, argv, positional="what",
                       check=_check, doc=__doc__)

`main(["fa3_table3", "quick=true"])` (what `python -m flashnum.run experiment=repro_fa3_table3
quick=true` calls) then calls _run(cfg) with the
composed config (a bare first word is the `positional` key); `--help` lists the keys
with their defaults. `run` itself composes conf/ (flashnum.harness.run.main).

Stopping: SIGTERM (`kill`, a batch system's time limit) is handled as Ctrl-C is: the
command stops its workers, says how to resume and exits with 143 (Ctrl-C: 130), the
finished work stored. A store that cannot be read or written (flashnum.store.files.
StoreError: a corrupt file, a read-only folder, a full disk) is one line on stderr.
"""

from __future__ import annotations

import errno
import signal
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import fields, is_dataclass

from hydra import compose, initialize
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

from flashnum.harness.config import Config
from flashnum.inputs.distributions import DISTRIBUTIONS
from flashnum.store.files import StoreError, check_root
from flashnum.store.paths import CONF

OPEN_MAPPINGS = ("sites", "params", "search")  # config keys whose entries are free-form


class ConfigError(ValueError):
    """A bad command line or config; its text is the one line the user sees."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so that it stops as Ctrl-C stops it."""


def _terminate(signum, frame):
    raise Terminated()


@contextmanager
def sigterm_stops():
    """While inside, SIGTERM raises Terminated in the main thread (a command's, never a
    worker's); the earlier handler comes back after (a launcher's worker keeps its own)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def stopped(prog: str, e: KeyboardInterrupt, what: str):
    """The one line of a command stopped by Ctrl-C (exit 130) or SIGTERM (exit 143)."""
    how = "terminated" if isinstance(e, Terminated) else "interrupted"
    fail(prog, f"{how}: {what}", 143 if isinstance(e, Terminated) else 130)


WRITE_ERRORS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)


def store_failed(prog: str, e: Exception):
    """The one line of a store that cannot be read or written; exit status 2."""
    if isinstance(e, StoreError):
        fail(prog, str(e))
    where = f" {e.filename}" if getattr(e, "filename", None) else ""
    fail(prog, f"cannot write{where}: {e.strerror or e} (a read-only or full store: "
         f"give a writable one with store.root=DIR)")


def fail(prog: str, msg: str, code: int = 2):
    """Print `prog: error: msg` (one line) on stderr and exit with `code`."""
    print(f"{prog}: error: {msg.splitlines()[0] if msg else 'failed'}", file=sys.stderr,
          flush=True)
    sys.exit(code)


def _chain(exc: BaseException):
    seen = 0
    while exc is not None and seen < 8:
        yield exc
        exc = exc.__cause__ or exc.__context__
        seen += 1


def _options(group: str, found=()) -> list[str]:
    """The choices of a config group: what Hydra found, the yaml files, the distributions."""
    opts = list(found or [])
    d = CONF / group
    opts += [p.stem for p in d.glob("*.yaml")] if d.is_dir() else []
    if group == "distribution":
        opts += list(DISTRIBUTIONS)
    return sorted(set(opts))


def _schema_keys(schema, key: str) -> list[str]:
    """The keys the schema allows beside `key` (at the same level)."""
    node = OmegaConf.structured(schema)
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    sub = OmegaConf.select(node, parent) if parent else node
    return sorted(sub.keys()) if hasattr(sub, "keys") else []


def _type_word(node) -> str:
    """integer, float, boolean, string: the type an OmegaConf value node holds."""
    return type(node).__name__.removesuffix("Node").lower() or "another type"


def explain(exc: BaseException, schema=None) -> str:
    """One line for a Hydra / OmegaConf error: the bad value or key, and the choices.

    Reads the exceptions' public attributes (MissingConfigException.missing_cfg_file
    and .options, OmegaConf's .full_key and .value), never their text; `schema` is the
    dataclass whose keys are listed for an unknown key (default: run's Config).
    """
    schema = Config if schema is None else schema
    for e in _chain(exc):
        if isinstance(e, MissingConfigException) and e.missing_cfg_file:
            group, _, name = e.missing_cfg_file.rpartition("/")
            if group:
                return f"unknown {group} {name!r}; valid: {', '.join(_options(group, e.options))}"
            return f"config {name!r} not found"
        if isinstance(e, ValidationError) and getattr(e, "full_key", None):
            return (f"bad value {e.value!r} for {e.full_key}: expected "
                    f"{_type_word(e.child_node)}")
        if isinstance(e, (ConfigAttributeError, ConfigKeyError)) and getattr(e, "full_key", None):
            key = e.full_key
            parent = key.rsplit(".", 1)[0]
            if parent.split(".")[-1] in OPEN_MAPPINGS:
                return f"{key} is not set yet; add it with +{key}=VALUE"
            valid = _schema_keys(schema, key)
            return f"unknown key {key!r}; valid: {', '.join(valid)}" if valid else (
                f"unknown key {key!r}")
    text = "\n".join(str(e) for e in _chain(exc))
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)


def first_values(overrides: list[str]) -> list[str]:
    """The overrides with each sweep (a,b / range(..) / choice(..)) cut to its first value."""
    out = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.is_sweep_override():
            try:
                first = next(iter(o.sweep_string_iterator()))
            except Exception:
                continue
            out.append(f"{o.get_key_element()}={first}")
        else:
            out.append(o.input_line)
    return out


def hydra_args(argv: list[str]):
    """Hydra's own reading of a command line (flags, overrides, multirun).

    Hydra has no public parser of its command line; this is the one hydra.main uses,
    so `python -m flashnum.run` accepts exactly Hydra's flags. The only private import.
    """
    from hydra._internal.utils import get_args_parser

    return get_args_parser().parse_known_args(argv)[0]


def _usage(prog: str, schema, doc: str | None, positional: str | None) -> str:
    lines = [(doc or "").strip(), "", f"usage: python -m {prog}"
             + (f" [{positional}]" if positional else "") + " [key=value ...]", "", "keys:"]
    node = OmegaConf.to_container(OmegaConf.structured(schema))
    for f in fields(schema):
        lines.append(f"  {f.name}={node[f.name]!r}")
    return "\n".join(lines).strip() + "\n"


def parse(prog: str, schema, argv: list[str] | None = None, *,
          positional: str | None = None, doc: str | None = None):
    """The schema's config with the `key=value` overrides of argv; exit 2 when bad."""
    if not is_dataclass(schema):
        raise TypeError(f"schema must be a dataclass, got {schema!r}")
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(_usage(prog, schema, doc, positional), end="")
        sys.exit(0)
    if positional and argv and "=" not in argv[0] and not argv[0].startswith("-"):
        argv[0] = f"{positional}={argv[0]}"
    bad = [a for a in argv if "=" not in a]
    if bad:
        fail(prog, f"{bad[0]!r} is not key=value; valid keys: "
             f"{', '.join(f.name for f in fields(schema))}")
    name = f"{prog.replace('.', '_')}_args"
    ConfigStore.instance().store(name=name, node=schema)
    try:
        with initialize(version_base="1.3", config_path=None):
            return compose(name, overrides=argv)
    except Exception as e:
        fail(prog, explain(e, schema))


def alias(to_run: Callable[[list[str]], list[str]], argv: list[str] | None = None):
    """Run `python -m flashnum.run` with the arguments to_run(argv): an older command kept as
    an alias of the one runner (its arguments translated, its exit status the runner's).
    flashnum.run sits above every layer, so it is run by name, as `python -m` runs it."""
    import runpy

    sys.argv = ["flashnum.run", *to_run(list(sys.argv[1:] if argv is None else argv))]
    runpy.run_module("flashnum.run", run_name="__main__", alter_sys=True)


def named(prefix: str = "", suffix: str = "") -> Callable[[list[str]], list[str]]:
    """An alias's translation: a first bare word NAME (or experiment=NAME) becomes
    experiment=PREFIX+NAME+SUFFIX; the other arguments go as they are."""
    def to_run(argv: list[str]) -> list[str]:
        out = list(argv)
        for i, a in enumerate(out):
            if a.startswith("experiment=") or ("=" not in a and not a.startswith("-")):
                out[i] = f"experiment={prefix}{a.removeprefix('experiment=')}{suffix}"
                break
        return out
    return to_run


def main_of(prog: str, schema, run: Callable, argv: list[str] | None = None, *,
            positional: str | None = None, check: Callable | None = None,
            doc: str | None = None) -> int:
    """parse, then check(cfg) (a ValueError is a one-line exit 2), then run(cfg) -> status."""
    cfg = parse(prog, schema, argv, positional=positional, doc=doc)
    try:
        if "store" in cfg and cfg.store.root:
            check_root(cfg.store.root)
        if check is not None:
            check(cfg)
    except (ValueError, StoreError) as e:
        fail(prog, str(e))
    try:
        with sigterm_stops():
            return int(run(cfg) or 0)
    except KeyboardInterrupt as e:
        stopped(prog, e, "what finished is stored; run the same command to go on")
    except StoreError as e:
        store_failed(prog, e)
    except OSError as e:
        if e.errno not in WRITE_ERRORS:
            raise
        store_failed(prog, e)
