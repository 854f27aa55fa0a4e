"""The audit's public surface: flashnum.audit(fn, ...) works as the docs write it, every
mention in the docs agrees with it, and the GPU script audits gradients (smoke-run here on
the CPU with torch's flash backend)."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import torch

import flashnum
from flashnum.audit import Case

ROOT = Path(__file__).resolve().parents[1]
ONE = [Case("gaussian", 77, 77, 64, True, 1, 1)]


def sdpa(q, k, v, causal=False, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                            scale=scale)


def test_flashnum_audit_is_called_as_the_docs_write_it():
    rep = flashnum.audit(sdpa, precision="bf16", case_list=ONE)
    assert rep.passed and rep.target.endswith("sdpa")
    import flashnum.audit as fa

    again = fa.audit(sdpa, precision="bf16", case_list=ONE)  # the same function
    assert list(again.table["err_max"]) == list(rep.table["err_max"])
    assert callable(flashnum.audit) and flashnum.audit.cases is fa.cases


def test_a_fresh_interpreter_calls_flashnum_audit_after_import_flashnum():
    code = ("import flashnum, torch\n"
            "from flashnum.audit import Case\n"
            "f = lambda q, k, v, causal=False, scale=None: "
            "torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)\n"
            "r = flashnum.audit(f, precision='bf16', "
            "case_list=[Case('gaussian', 40, 40, 64, False, 1, 1)])\n"
            "print(r.passed)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    assert out.stdout.strip() == "True"


def test_every_mention_in_the_docs_is_a_call_that_works():
    # flashnum.audit(...) and flashnum.audit.audit(...) both call the audit; docs write
    # the first; neither is written as something else (e.g. flashnum.audit.run)
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    seen = 0
    for f in files:
        for m in re.finditer(r"flashnum\.audit(\.[A-Za-z_]+)?\(", f.read_text()):
            seen += 1
            assert m.group(1) in (None, ".audit"), f"{f.name}: {m.group(0)}"
    assert seen >= 4


def test_the_gpu_script_audits_gradients_and_smoke_runs_on_the_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location("audit_gpu", ROOT / "bench" / "audit_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not torch.cuda.is_available():
        assert mod.main(["--out", str(tmp_path / "none")]) == 2
    rc = mod.main(["--device", "cpu", "--backends", "FLASH_ATTENTION", "--precisions", "bf16",
                   "--budget", "quick", "--max-cases", "1", "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads((tmp_path / "audit_gpu.json").read_text())
    (run,) = res["runs"]
    assert run["backward"] is True and run["passed"] is True
    assert run["worst"]["quantity"] in ("out", "dq", "dk", "dv")
    assert (tmp_path / "torch_sdpa_FLASH_ATTENTION-bf16" / "error_vs_limit.png").exists()
