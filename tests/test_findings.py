"""The audit's bug report: the findings/ reproducers still show their defects, and the writer
turns a broken kernel into a smaller standalone reproducer that fails, and passes once
the kernel is correct.

Each reproducer runs in a fresh interpreter (no flashnum imported there: it recomputes
the reference, standard attention and the rule itself), so its verdict shares no code
with the audit that wrote it.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
REPRODUCERS = sorted((ROOT / "findings").glob("*/*.py"))
SLOW = ("jax_pallas",)  # Pallas interpreted, with gradients: 15 s at load 8, near the 20 s line


def _requires(path: Path) -> tuple[str, ...]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "REQUIRES":
            return ast.literal_eval(node.value)
    return ()


def _run(path: Path, timeout=600) -> tuple[int, str]:
    p = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                       timeout=timeout, cwd=path.parent)
    return p.returncode, p.stdout + p.stderr


def _ratio(text: str) -> float:
    m = re.search(r"ratio (\S+)", text)
    assert m, text
    return float(m.group(1))


def test_there_are_findings():
    assert len(REPRODUCERS) >= 6, REPRODUCERS


@pytest.mark.parametrize("path", [pytest.param(p, id=f"{p.parent.name}/{p.stem}", marks=(
    [pytest.mark.slow] if p.parent.name.startswith(SLOW) else [])) for p in REPRODUCERS])
def test_reproducer_still_shows_its_defect(path):
    text = path.read_text()
    assert "flashnum" not in "".join(line for line in text.splitlines()
                                     if line.lstrip().startswith(("import ", "from ")))
    missing = [p for p in _requires(path) if importlib.util.find_spec(p) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")
    if "tinygrad" in _requires(path):  # its CPU device needs a clang on PATH, as a user's
        from flashnum.audit.targets_tinygrad import use_toolchain

        use_toolchain()
    rc, out = _run(path)
    if rc == 2:
        pytest.skip(out.strip().splitlines()[-1])
    assert rc == 1, out
    assert "DEFECT PRESENT" in out and _ratio(out) > 1, out


# -- the writer, on a kernel broken on purpose ---------------------------------------------

def logits_to_3_bits(q, k, v, causal=False, scale=None):
    """Attention whose logits keep 3 significant bits (fp32 otherwise)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    m, e = torch.frexp(s)
    s = torch.ldexp(torch.round(m * 8) / 8, e)
    if causal:
        nq, nk = s.shape[-2:]
        s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool).triu(1), -math.inf)
    return torch.matmul(torch.softmax(s, dim=-1), v.float()).to(q.dtype)


CORRECT = '''

def sdpa_float64(q, k, v, causal=False, scale=None):
    """The exact attention rounded once to the dtype: on every output it is the dtype's
    nearest value to the reference, so no standard attention in that dtype errs less,
    and it keeps the rule."""
    return torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=causal, scale=scale).to(q.dtype)
'''


@pytest.mark.slow  # 20-26 s on the 2 shared cores (load about 8): three fresh interpreters
def test_writer_shrinks_and_the_reproducer_fails_then_passes(tmp_path):
    import flashnum
    from flashnum.audit.cases import Case

    case = Case("gaussian", 40, 40, 32, True, 1, 2)
    rep = flashnum.audit(logits_to_3_bits, precision="bf16", case_list=[case],
                         diagnose=False, report_dir=tmp_path)
    assert not rep.passed
    (entry,) = [e for e in rep.info["bug_report"] if e["rule"] == "fa_rule"]
    b, h, nq, nk, d = entry["shape"]
    assert b * h < case.batch * case.heads and nq < case.nq and nk < case.nk and d < case.d
    assert entry["calls"] <= 120
    path = tmp_path / entry["file"]
    readme = (tmp_path / "README.md").read_text()
    assert "fa_rule" in readme and f"Nq={nq}" in readme
    rc, out = _run(path, timeout=120)
    assert rc == 1 and _ratio(out) > 1, out
    assert entry["status"] == 1  # the writer's own run agrees
    # the same file with a correct kernel in place of the broken one
    text = path.read_text()
    line = re.search(r"^kernel = logits_to_3_bits\b.*$", text, flags=re.M)
    assert line, text
    fixed = tmp_path / "fixed.py"
    fixed.write_text(text.replace(line.group(0), CORRECT + "\nkernel = sdpa_float64"))
    rc, out = _run(fixed, timeout=120)
    assert rc == 0 and "rule kept" in out, out


def test_a_shrunk_reproducer_fails_in_a_fresh_interpreter(tmp_path):
    """The quick form of the test above: a bounded shrink, one reproducer, one run."""
    from flashnum.audit import reproducer
    from flashnum.audit.cases import Case
    from flashnum.audit.shrink import Instance, shrink
    from flashnum.audit.standalone import standalone

    case = Case("gaussian", 24, 24, 16, False, 1, 2)
    small = shrink(logits_to_3_bits, Instance.of_case(case, "bf16"), "fa_rule",
                   alignment="top_left", max_calls=25)
    assert small.calls <= 25 and small.ratio > 1
    b, h, nq, nk, d = small.instance.shape
    assert b * h == 1 and nq * nk * d < case.nq * case.nk * case.d
    path = reproducer.write(tmp_path / "fa_rule.py", small.instance, "fa_rule",
                            standalone(logits_to_3_bits), alignment="top_left", title="toy")
    rc, out = _run(path, timeout=120)
    assert rc == 1 and _ratio(out) > 1, out


def test_a_module_function_target_is_one_import_line():
    from flashnum.audit.standalone import standalone

    s = standalone("my_pkg.attn:forward")
    assert s.code == "from my_pkg.attn import forward\n" and s.name == "forward"
    assert s.packages == ("my_pkg",)


def test_a_kernel_that_needs_flashnum_is_refused():
    from flashnum.audit.standalone import standalone
    from flashnum.audit.targets import flashnum_triton

    with pytest.raises(ValueError, match="flashnum"):
        standalone(flashnum_triton)


def test_shrink_refuses_a_rule_it_cannot_show():
    from flashnum.audit.cases import Case
    from flashnum.audit.shrink import Instance, shrink

    inst = Instance.of_case(Case("gaussian", 8, 8, 4, False, 1, 1), "fp32")
    with pytest.raises(ValueError, match="crash"):
        shrink(logits_to_3_bits, inst, "crash", alignment="top_left")
    with pytest.raises(ValueError, match="does not break"):
        shrink(_sdpa, inst, "fa_rule",
               alignment="top_left")


def _sdpa(q, k, v, causal=False, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                            scale=scale)


def _load(path: Path):
    """A reproducer's module, its main() not run: its tensor() gives the exact inputs."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_torch_sdpa_dk_finding_is_d_from_the_rounded_output():
    """findings/README.md's cause of the torch_sdpa dK finding: FlashAttention-2's
    arithmetic, emulated, breaks dk_rule on the minimal input, and keeps it when the
    forward's output (the O that D = rowsum(dO * O) reads) is not rounded to bf16."""
    from dataclasses import replace

    from flashnum.api import attention_backward
    from flashnum.audit import gradients
    from flashnum.numerics.policy import make_backward_policy

    path = ROOT / "findings" / "torch_sdpa_bf16_dk" / "dk_rule.py"
    rep = _load(path)
    q, k, v, do = (rep.tensor(n) for n in ("q", "k", "v", "do"))
    kw = dict(causal=rep.CAUSAL, alignment=rep.ALIGNMENT, scale=rep.SCALE)
    ref = gradients.reference_gradients(q.double(), k.double(), v.double(), do.double(), **kw)
    std = gradients.standard_gradients(q, k, v, do, **kw)
    _, limit = gradients.bound(std[1], ref[1])
    fa2 = make_backward_policy("fa2", "bf16")
    exact_o = fa2.with_sites(forward=replace(fa2.forward, out="exact"))

    def dk_ratio(pol):
        g = attention_backward(q, k, v, do, precision="bf16", policy=pol, causal=rep.CAUSAL,
                               scale=rep.SCALE)
        return float((g.dk.double() - ref[1]).abs().max()) / limit

    assert dk_ratio(fa2) > 1
    assert dk_ratio(exact_o) < 1


@pytest.mark.slow  # the quick budget's 8 cases, then a shrink per broken rule
def test_cli_report_dir_with_a_module_function_target(tmp_path):
    """target=pkg.mod:func: the reproducer imports the kernel with that one line."""
    import inspect

    (tmp_path / "toy_kernels.py").write_text(
        "import math\n\nimport torch\n\n\n" + inspect.getsource(logits_to_3_bits))
    env = dict(__import__("os").environ, PYTHONPATH=str(tmp_path))
    out_dir = tmp_path / "bug"
    p = subprocess.run([sys.executable, "-m", "flashnum.audit",
                        "target=toy_kernels:logits_to_3_bits", "precision=bf16",
                        "budget=quick", "diagnose=false", f"report_dir={out_dir}",
                        f"store.root={tmp_path / 'store'}"],
                       capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert p.returncode == 1, p.stdout + p.stderr
    path = out_dir / "fa_rule.py"
    assert "from toy_kernels import logits_to_3_bits\n" in path.read_text()
    assert "fa_rule" in (out_dir / "README.md").read_text()
    q = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                       timeout=300, env=env, cwd=out_dir)
    assert q.returncode == 1 and _ratio(q.stdout) > 1, q.stdout + q.stderr


SCALE_SITES = '''

def scaled_once(q, k, v, causal=False, scale=None):
    return _attend(torch.matmul(q, k.transpose(-1, -2)) * scale, v, causal)


def scaled_split(q, k, v, causal=False, scale=None):
    r = math.sqrt(scale)  # ATen's math backend: Q and K each times fl32(sqrt(scale))
    return _attend(torch.matmul(q * r, (k * r).transpose(-1, -2)), v, causal)


def _attend(s, v, causal):
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    return torch.matmul(torch.softmax(s, dim=-1), v)
'''


@pytest.mark.parametrize("kernel, status", [("scaled_split", 1), ("scaled_once", 0)])
def test_torch_math_finding_is_the_split_scale(tmp_path, kernel, status):
    """findings/README.md's cause of the torch_math finding, on its minimal input: fp32
    attention with Q and K each multiplied by sqrt(scale) breaks the rule, the same
    operations with the scale applied once to S keep it (the reproducer's own rule)."""
    path = ROOT / "findings" / "torch_math_fp32_split_scale" / "fa_rule.py"
    text = path.read_text()
    line = re.search(r"^kernel = torch_math\b.*$", text, flags=re.M)
    assert line, text
    patched = tmp_path / "fa_rule.py"
    patched.write_text(text.replace(line.group(0), SCALE_SITES + f"\nkernel = {kernel}"))
    rc, out = _run(patched, timeout=120)
    assert rc == status, out
