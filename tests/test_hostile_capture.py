"""Hostile capture files: every one is refused in one line naming it and what is wrong,
before it is hashed or a tensor is read, by load_capture (a ValueError, as documented),
by distribution=captured in the runner (exit status 2) and by audit(inputs=); a case too
large for the machine is refused with its estimate, as flashnum.attention refuses calls.

Oracles: the exit status and the one line of stderr; time (a file that would be read or
hashed whole, /dev/zero or a sparse 1 GiB file, answers in seconds); the bytes of the
file (nothing rewritten).
"""

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

import flashnum
import flashnum.engine.checks
from flashnum.inputs.distributions import make

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A good capture and one file per way of being malformed (name -> path)."""
    d = tmp_path_factory.mktemp("hostile")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 24, 8, generator=g) for _ in range(3))
    with flashnum.capture(d / "good.safetensors") as cap:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    meta = cap.calls[0].meta()
    out = {"good": d / "good.safetensors"}

    def write(name, calls, tensors=None):
        m = {"format": "flashnum.capture/1"}
        if calls is not None:
            m["calls"] = json.dumps(calls)
        save_file(tensors or {"0.q": q, "0.k": k, "0.v": v}, str(d / name), metadata=m)
        out[name.split(".")[0]] = d / name

    write("nocalls.safetensors", None)
    write("ints.safetensors", [1, 2])
    write("dict.safetensors", {"a": 1})
    write("extra.safetensors", [{**meta, "evil": 1}])
    write("noindex.safetensors", [{f: x for f, x in meta.items() if f != "index"}])
    write("nov.safetensors", [meta], {"0.q": q, "0.k": k})
    write("evil.safetensors", [{**meta, "causal": "evil"}])
    write("badshape.safetensors", [meta], {"0.q": q, "0.k": k[..., :5].contiguous(), "0.v": v})
    (d / "zeros.safetensors").open("wb").truncate(1 << 30)  # sparse: no byte on disk
    out["zeros"] = d / "zeros.safetensors"
    (d / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    out["junk"] = d / "junk.safetensors"
    return out


WHY = {  # what each file's one line says is wrong with it
    "nocalls": "has no 'calls'", "ints": "not a JSON list of call records",
    "dict": "not a JSON list of call records", "extra": "unknown field(s) 'evil'",
    "noindex": "no index", "nov": "has no tensor 0.v", "evil": "causal is \"evil\"",
    "badshape": "k has shape [1, 2, 24, 5]", "zeros": "header length 0 does not fit",
    "junk": "its header is not JSON",
}


def big_capture(path: Path, log2_n: int = 26) -> Path:
    """A well-formed capture whose q, k, v are (1, 1, 2^log2_n, 256) fp32, left sparse."""
    n, d = 1 << log2_n, 256
    with flashnum.capture(None) as cap:
        F.scaled_dot_product_attention(*(torch.randn(1, 1, 4, d) for _ in range(3)))
    hdr, off = {"__metadata__": {"format": "flashnum.capture/1",
                                 "calls": json.dumps([cap.calls[0].meta()])}}, 0
    for t in "qkv":
        hdr[f"0.{t}"] = {"dtype": "F32", "shape": [1, 1, n, d],
                         "data_offsets": [off, off + 4 * n * d]}
        off += 4 * n * d
    h = json.dumps(hdr).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        f.truncate(8 + len(h) + off)
    return path


@pytest.mark.parametrize("name", sorted(WHY))
def test_a_malformed_capture_is_one_value_error_naming_the_file_and_what_is_wrong(files, name):
    before = files[name].stat().st_size
    for read in (flashnum.load_capture, lambda p: make("captured", path=str(p))):
        with pytest.raises(ValueError) as e:
            read(files[name])
        msg = str(e.value)
        assert str(files[name]) in msg and WHY[name] in msg and "\n" not in msg, msg
    assert files[name].stat().st_size == before  # nothing written


@pytest.mark.parametrize("path", ["/dev/zero", "/tmp"])
def test_a_device_or_a_folder_is_refused_at_once(path):
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="not a flashnum capture"):
        flashnum.load_capture(path)
    assert time.perf_counter() - t0 < 5  # never read whole


def test_a_missing_capture_is_a_value_error_and_still_a_file_not_found_error(tmp_path):
    for exc in (ValueError, FileNotFoundError):
        with pytest.raises(exc, match="no capture file at"):
            flashnum.load_capture(tmp_path / "nope.safetensors")


def test_a_capture_too_large_for_the_machine_is_refused_with_its_estimate_unread(tmp_path):
    path = big_capture(tmp_path / "big.safetensors")  # 192 GiB of tensors, none on disk
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"needs an estimated [0-9.]+ [GTP]B of memory"):
        make("captured", path=str(path))
    with pytest.raises(ValueError, match=r"needs an estimated [0-9.]+ [GTP]B of memory"):
        flashnum.audit(lambda q, k, v, causal=False, scale=None: q, inputs=str(path))
    assert time.perf_counter() - t0 < 10  # neither hashed nor read


def test_the_audit_applies_the_memory_estimate_to_a_captured_call(files, monkeypatch):
    monkeypatch.setattr(flashnum.engine.checks, "available_bytes", lambda: 1 << 16)
    with pytest.raises(ValueError, match=r"auditing captured call 0 .* needs an estimated"):
        flashnum.audit(lambda q, k, v, causal=False, scale=None: q, inputs=str(files["good"]))


def run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "flashnum.run", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("name", ["missing", "/dev/zero", "/proc/self/mem", "evil", "big"])
def test_the_runner_refuses_a_bad_capture_in_one_line_exit_2(files, tmp_path, name):
    path = {"missing": str(tmp_path / "nope.safetensors"), "/dev/zero": "/dev/zero",
            "/proc/self/mem": "/proc/self/mem", "evil": str(files["evil"]),
            "big": str(big_capture(tmp_path / "big.safetensors"))}[name]
    t0 = time.perf_counter()
    r = run("distribution=captured", f"distribution.path={path}", f"store.root={tmp_path}",
            "progress=false", "n_jobs=1")
    assert time.perf_counter() - t0 < 60  # the 192 GiB file is neither hashed nor read
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and path in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "single").exists()


# -- fuzz: whatever the header or the index holds, one ValueError or the calls ----------

JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 2**40) | st.floats()
                    | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c,
                                                                        max_size=4),
                    max_leaves=12)
FIELD = st.sampled_from(["index", "module", "module_type", "is_causal", "causal", "scale",
                         "scale_given", "mask_kind", "dropout_p", "enable_gqa", "heads", "rows",
                         "shape", "dtype", "evil"])


def _file(path: Path, header: dict) -> Path:
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h)
    return path


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=st.dictionaries(FIELD, JSON, max_size=8), calls=st.one_of(st.none(), JSON))
def test_fuzzed_call_records_are_read_or_refused_in_one_value_error(tmp_path_factory, record,
                                                                    calls):
    d = tmp_path_factory.mktemp("fuzz")
    for n, index in enumerate(([record], calls)):
        if index is None:
            continue
        meta = {"format": "flashnum.capture/1", "calls": json.dumps(index)}
        path = _file(d / f"f{n}.safetensors", {"__metadata__": meta})
        try:
            out = flashnum.load_capture(path)
        except ValueError as e:
            assert str(path) in str(e) and "\n" not in str(e)
        else:
            assert out == []  # only an empty index reads: every call needs its q, k, v


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flips=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), min_size=1,
                      max_size=6))
def test_a_capture_with_its_header_bytes_changed_is_read_or_refused_in_one_value_error(
        tmp_path_factory, flips):
    d = tmp_path_factory.mktemp("flip")
    g = torch.Generator().manual_seed(0)
    with flashnum.capture(d / "c.safetensors") as cap:
        F.scaled_dot_product_attention(*(torch.randn(1, 1, 4, 4, generator=g) for _ in "qkv"))
    data = bytearray((d / "c.safetensors").read_bytes())
    for i, b in flips:
        data[i % len(data)] = b
    (d / "c.safetensors").write_bytes(bytes(data))
    try:
        calls = flashnum.load_capture(d / "c.safetensors")
    except ValueError as e:
        assert "\n" not in str(e)
    else:  # a change the checks let through left a file that reads whole, as a capture
        assert len(calls) == 1 and calls[0].q.shape == cap.calls[0].q.shape
