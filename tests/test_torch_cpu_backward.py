"""attention_backward(model="torch_cpu") is torch's CPU SDPA backward, bit for bit.

The oracle is torch itself: autograd through torch.nn.functional.scaled_dot_product_attention
(ATen's cpu_flash_attention_backward), run in a fresh interpreter with torch's default
threads, so that its parallel loop runs as a user's first call runs it (this test process
has set one thread, and torch.set_num_threads changes MKL's threading of the kernel's fp32
GEMMs for the rest of a process; see flashnum/engine/torch_cpu_backward.py). The model is
given torch's forward O and LSE, so that what is checked is the backward alone; one test
checks the model's own forward plus backward through the public API.
"""

import json
import math
import subprocess
import sys

import pytest
import torch

import flashnum
from flashnum.models import torch_cpu_backward as tcb

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# (B, H, Nq, Nk, d, causal): one block; ragged query blocks with the causal diagonal;
# a ragged key block (555 = 512 + 43) at d = 80; causal Nq < Nk at d = 128 (key blocks past
# the diagonal skipped, the first one visited whole); causal Nq > Nk; a decode row
CASES = [
    (1, 2, 64, 64, 64, False),
    (1, 2, 200, 200, 64, True),
    (1, 2, 37, 555, 80, False),
    (2, 1, 70, 600, 128, True),
    (1, 2, 90, 50, 64, True),
    (1, 2, 1, 300, 64, False),
]

ORACLE = r"""
import json, sys, torch
import torch.nn.functional as F
cases, path = json.loads(sys.argv[1]), sys.argv[2]
dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
res = {}
for prec, (b, h, nq, nk, d, causal), seed in cases:
    g = torch.Generator().manual_seed(seed)
    q, k, v = [torch.randn(b, h, n, d, generator=g).to(dtypes[prec]) for n in (nq, nk, nk)]
    do = torch.randn(b, h, nq, d, generator=g).to(dtypes[prec])
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    o = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    o.backward(do)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, is_causal=causal)[:2]
    assert torch.equal(out, o.detach())
    res[repr((prec, b, h, nq, nk, d, causal, seed))] = dict(
        q=q, k=k, v=v, do=do, out=out, lse=lse, dq=leaves[0].grad, dk=leaves[1].grad,
        dv=leaves[2].grad)
torch.save(dict(threads=torch.get_num_threads(), cases=res), path)
"""


@pytest.fixture(scope="module")
def torch_grads(tmp_path_factory):
    """Every case's inputs, torch's forward (O, LSE) and torch's gradients, computed by a
    fresh interpreter; and the number of threads its kernel ran on."""
    cases = [[p, list(c), 0] for p in DTYPES for c in CASES]
    path = tmp_path_factory.mktemp("oracle") / "torch_grads.pt"
    r = subprocess.run([sys.executable, "-c", ORACLE, json.dumps(cases), str(path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return torch.load(path)


def _bitwise_share(mine: torch.Tensor, want: torch.Tensor) -> float:
    return float((mine.to(want.dtype) == want).double().mean())


pytestmark = pytest.mark.skipif(
    torch.backends.cpu.get_cpu_capability() != "AVX512",
    reason="the model is of torch's AVX-512 build (16-lane sums, SLEEF's AVX-512 exp)")


@pytest.mark.parametrize("precision", list(DTYPES))
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_each_gradient_equals_torch_autograd_bit_for_bit(torch_grads, precision, case):
    b, h, nq, nk, d, causal = case
    t = torch_grads["cases"][repr((precision, b, h, nq, nk, d, causal, 0))]
    g = tcb.attention_backward_torch_cpu(
        t["q"], t["k"], t["v"], t["do"], precision=precision,
        causal="top_left" if causal else False, out=t["out"], lse=t["lse"],
        threads=torch_grads["threads"])
    shares = {name: _bitwise_share(getattr(g, name), t[name]) for name in ("dq", "dk", "dv")}
    assert shares == {"dq": 1.0, "dk": 1.0, "dv": 1.0}


def test_the_public_api_with_its_own_forward_equals_torch(torch_grads):
    """flashnum.attention_backward(model="torch_cpu") runs flashnum's torch_cpu forward
    (O, LSE) and this backward: torch's gradients bit for bit, causal as torch's."""
    t = torch_grads["cases"][repr(("bf16", 1, 2, 200, 200, 64, True, 0))]
    g = flashnum.attention_backward(t["q"], t["k"], t["v"], t["do"], precision="bf16",
                                    model="torch_cpu", causal=True)
    assert torch.equal(g.out.to(torch.bfloat16), t["out"]) and torch.equal(g.lse.float(),
                                                                           t["lse"])
    for name in ("dq", "dk", "dv"):
        assert _bitwise_share(getattr(g, name), t[name]) == 1.0
    assert g.info["model"] == "torch_cpu" and g.info["causal"] == "top_left"
    assert g.info["variant"] == "fa2"  # the forward ran here


def test_the_torch_twin_of_the_c_exp_gives_the_same_bits():
    if tcb._clib() is None:
        pytest.skip("no C compiler: only the torch path exists")
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(4000, generator=g) * 30, torch.linspace(-110, 110, 4001),
                   torch.tensor([-104.0, -103.99, 100.0, 100.01, 0.0, -0.0, 88.7, -87.4,
                                 1e-30, -1e-30])]).reshape(-1, 1)
    lse = torch.zeros(x.shape[0])
    a = x.clone()
    tcb.exp_rows(a, lse, use_c=True)
    b = tcb.sleef_expf_u10(x)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    # SLEEF's u10 is within one ulp of exp; not torch.exp's own function everywhere
    ref = torch.exp(x.double())
    ok = (ref > 1e-30) & (ref < 1e30)
    ulp = torch.finfo(torch.float32).eps * ref.abs()
    assert bool(((b.double() - ref).abs()[ok] <= ulp[ok]).all())


def test_c_and_torch_paths_of_the_model_agree():
    g = torch.Generator().manual_seed(3)
    q, k, v, do = [torch.randn(1, 2, n, 80, generator=g).bfloat16() for n in (40, 70, 70, 40)]
    a = tcb.attention_backward_torch_cpu(q, k, v, do, precision="bf16", causal="top_left")
    b = tcb.attention_backward_torch_cpu(q, k, v, do, precision="bf16", causal="top_left",
                                         use_c=False)
    assert all(torch.equal(getattr(a, n), getattr(b, n)) for n in ("dq", "dk", "dv", "delta"))


def test_d_is_summed_in_the_kernels_lane_order():
    """D = rowsum(dO * O) as vec::map2_reduce_all adds it: checked against the same order
    written out in Python floats rounded to fp32 one operation at a time."""
    import numpy as np

    g = torch.Generator().manual_seed(1)
    for d in (13, 64, 80, 100):
        x, y = torch.randn(3, d, generator=g), torch.randn(3, d, generator=g)
        got = tcb.rowsum_products(x, y, "fp32")
        f = np.float32
        for r in range(3):
            p = [f(x[r, i]) * f(y[r, i]) for i in range(d)]
            if d < 16:
                want = p[0]
                for i in range(1, d):
                    want = f(want + p[i])
            else:
                acc = p[:16]
                full = 16 * (d // 16)
                for c0 in range(16, full, 16):
                    acc = [f(acc[i] + p[c0 + i]) for i in range(16)]
                for i in range(d - full):
                    acc[i] = f(acc[i] + p[full + i])
                for half in (8, 4, 2, 1):
                    acc = [f(acc[i] + acc[i + half]) for i in range(half)]
                want = acc[0]
            assert float(got[r]) == float(want)


def test_bad_arguments_get_one_clear_error():
    q = torch.randn(1, 1, 5, 8)
    k = torch.randn(1, 1, 7, 8)
    with pytest.raises(ValueError, match="top-left"):
        flashnum.attention_backward(q, k, k, q, precision="bf16", model="torch_cpu",
                                    causal="bottom_right")
    with pytest.raises(ValueError, match="causal must be True or False"):
        flashnum.attention_backward(q, k, k, q, precision="bf16", model="torch_cpu",
                                    causal="diagonal")
    with pytest.raises(ValueError, match="valid: fp32, bf16, fp16"):
        flashnum.attention_backward(q, k, k, q, precision="fp64", model="torch_cpu")
    with pytest.raises(ValueError, match="exp2"):
        flashnum.attention_backward(q, k, k, q, precision="bf16", model="torch_cpu",
                                    exp2=True)
    # True is bottom-right for every policy: with Nq != Nk torch's mask is named
    with pytest.raises(ValueError, match="causal='top_left'"):
        flashnum.attention_backward(q, k, k, q, precision="bf16", model="torch_cpu",
                                    causal=True)
    a = flashnum.attention_backward(q, k, k, q, precision="bf16", model="torch_cpu",
                                    causal="top_left")
    assert math.isfinite(float(a.dq.abs().sum()))
