"""The torch_cpu policy is torch's own CPU flash attention, bit for bit.

The oracle is the real kernel (torch.nn.functional.scaled_dot_product_attention on CPU,
ATen's cpu_flash_attention), which shares no code with the model.
"""

import pytest
import torch
import torch.nn.functional as F

import flashnum
from flashnum.models import torch_cpu, torch_cpu_gemm

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _inputs(b, h, nq, nk, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g).to(dtype) for n in (nq, nk, nk)]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype]))


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize(
    "nq,nk,d,causal",
    [
        (64, 64, 64, False),     # one block each way
        (200, 200, 64, True),    # q split 64, ragged last query block, causal diagonal
        (37, 555, 80, False),    # ragged key block (555 = 512 + 43: a 16-lane tail of 11)
        (4, 1100, 128, False),   # decode: a few query rows, three key blocks
        (1, 3000, 64, False),    # one query row: MKL would split its GEMV over threads
        (70, 600, 64, True),     # causal with Nk > Nq: top-left, later key blocks skipped
        (90, 50, 64, True),      # causal with Nq > Nk
    ],
)
def test_the_model_equals_torch_sdpa_bit_for_bit(precision, nq, nk, d, causal):
    dtype = DTYPES[precision]
    q, k, v = _inputs(1, 2, nq, nk, d, dtype)
    want, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, is_causal=causal)[:2]
    assert _same_bits(want, F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    res = flashnum.attention(q, k, v, precision=precision, model="torch_cpu",
                             causal="top_left" if causal else False)  # torch's is_causal
    assert _same_bits(res.out.to(dtype), want)
    assert _same_bits(res.lse.float(), lse)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_the_c_loop_and_the_torch_one_give_the_same_bits(precision):
    if torch_cpu._clib() is None:
        pytest.skip("no C compiler: only the torch path exists")
    q, k, v = _inputs(1, 1, 40, 600, 64, DTYPES[precision], seed=3)
    a = torch_cpu.attention_torch_cpu(q, k, v, precision=precision, causal=True)
    b = torch_cpu.attention_torch_cpu(q, k, v, precision=precision, causal=True, use_c=False)
    assert torch.equal(a.out, b.out) and torch.equal(a.lse, b.lse)


def test_the_splits_follow_the_query_length_as_the_kernel_dispatches():
    assert torch_cpu.split_sizes(100, 4096) == (32, 512)
    assert torch_cpu.split_sizes(192, 100) == (64, 100)
    assert torch_cpu.split_sizes(768, 768) == (256, 512)
    assert torch_cpu.split_sizes(10, 10) == (10, 10)


def test_an_explicit_scale_is_used_as_the_kernel_uses_it():
    q, k, v = _inputs(1, 1, 33, 70, 48, torch.bfloat16, seed=5)
    want = F.scaled_dot_product_attention(q, k, v, scale=1.3)
    res = flashnum.attention(q, k, v, precision="bf16", model="torch_cpu", scale=1.3)
    assert _same_bits(res.out.to(torch.bfloat16), want)


def test_a_precision_the_kernel_does_not_run_is_rejected_in_one_line():
    q, k, v = _inputs(1, 1, 4, 4, 8, torch.float32)
    with pytest.raises(ValueError, match="valid: fp32, bf16, fp16"):
        flashnum.attention(q, k, v, precision="fp8_e4m3", model="torch_cpu")


@pytest.mark.parametrize("nq,nk,d,causal", [(100, 100, 80, False), (300, 300, 80, True),
                                            (100, 77, 63, True)])
def test_the_packed_bf16_path_equals_torch_where_the_machine_packs(nq, nk, d, causal):
    """Where cpublas::could_pack(bf16) (oneDNN's AMX brgemm), the kernel multiplies S and P V
    on VNNI-packed K and V for lengths >= 64 (need_pack): the model does the same (odd d and
    odd key blocks padded as the kernel pads them)."""
    if not torch_cpu_gemm.need_pack("bf16", 2, nq, nk, d, 32 if nq < 192 else 64, causal,
                               torch.get_num_threads()):
        pytest.skip("this machine's torch does not pack bf16 (no AMX)")
    q, k, v = _inputs(1, 2, nq, nk, d, torch.bfloat16, seed=1)
    want, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, is_causal=causal)[:2]
    res = flashnum.attention(q, k, v, precision="bf16", model="torch_cpu",
                             causal="top_left" if causal else False)  # torch's is_causal
    assert _same_bits(res.out.to(torch.bfloat16), want)
    assert _same_bits(res.lse.float(), lse)
