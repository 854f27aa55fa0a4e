"""What Triton's CPU interpreter computes differently from the engine, and how far flashnum's
Triton kernel run on it is from the engine: the table of the experiment triton_interpreter
(conf/table/triton_interpreter.yaml; README and docs/kernel.md quote it through
flashnum.figures.docs.kernel).

    python -m flashnum.run experiment=triton_interpreter

Rows of kind "fact" (what tl.exp, tl.exp2 and tl.dot run on the interpreter):
  exp, exp2   numpy's float32 exp / exp2 against the correctly rounded value over 2e6
              arguments uniform in [-30, 0] (numpy seed 0): the share not correctly
              rounded and the largest difference in ulps;
  dot_dD      numpy's fp32 matmul (the interpreter's tl.dot) on fp16-valued operands of
              shape (64, D) x (D, 64): its share equal to a sequential sum over D and to
              torch's matmul (the engine's).
Rows of kind "fidelity": flashnum.backends.triton.compare_with_engine, the kernel on the
interpreter against the engine (same policy, tiling and order) for 2 x 2 heads, Nq = 96,
Nk = 110, d = 64, 32 x 32 blocks, inputs N(0, 1), seeds 0, 1, 2, fp16 / bf16 / fp32, fa2
and exp2 (tests/test_triton.py's case and two more seeds): the shares of outputs within
0, 1 and 2 ulps of the output format at |out| ("elem") and at softmax(S) @ |V|
("scaled"), the largest of each, and whether the running max and the masked rows agree.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch


def interpreter_facts(dims=(64, 128, 192, 256)) -> list[dict]:
    """The kind "fact" rows (see the module's docstring)."""
    rng = np.random.default_rng(0)
    x = (-rng.random(2_000_000) * 30).astype(np.float32)
    rows = []
    for name, fn in (("exp", np.exp), ("exp2", np.exp2)):
        cr = fn(x.astype(np.float64)).astype(np.float32)  # float64, rounded once
        ulps = np.abs(fn(x).astype(np.float64) - cr) / np.spacing(cr)
        rows.append(dict(kind="fact", name=name,
                         frac_not_correctly_rounded=float(np.mean(ulps > 0)),
                         max_ulp=float(ulps.max())))
    for d in dims:
        a = rng.standard_normal((64, d)).astype(np.float16).astype(np.float32)
        b = rng.standard_normal((d, 64)).astype(np.float16).astype(np.float32)
        seq = np.zeros((64, 64), np.float32)
        for i in range(d):  # one term at a time, in fp32
            seq += a[:, i : i + 1] * b[i : i + 1, :]
        n = np.matmul(a, b)
        t = (torch.from_numpy(a) @ torch.from_numpy(b)).numpy()
        rows.append(dict(kind="fact", name=f"dot_d{d}",
                         numpy_eq_sequential=float(np.mean(n == seq)),
                         numpy_eq_torch=float(np.mean(n == t))))
    return rows


def fidelity_rows(lead, nq, nk, ds, precisions, variants, block, seeds=(0,),
                  fusion=(False,)) -> list[dict]:
    """The kernel against the engine, one row per seed x d x precision x variant x fusion:
    compare_with_engine's ulp shares flattened (elem_le1, scaled_max, ...)."""
    from flashnum.backends import triton as tf  # sets TRITON_INTERPRET=1 without a GPU

    rows = []
    for seed in seeds:
        for d in ds:
            g = torch.Generator().manual_seed(seed)
            q = torch.randn(*lead, nq, d, generator=g)
            k, v = (torch.randn(*lead, nk, d, generator=g) for _ in range(2))
            for precision in precisions:
                for variant in variants:
                    for fp_fusion in fusion if precision == "bf16" else (False,):
                        c = tf.compare_with_engine(q, k, v, precision=precision,
                                                   block_m=block, block_n=block,
                                                   variant=variant, fp_fusion=fp_fusion)
                        rows.append(dict(
                            kind="fidelity", name=f"{precision}/{variant}", lead=list(lead),
                            nq=nq, nk=nk, d=d, block=block, seed=seed, precision=precision,
                            variant=variant, fp_fusion=fp_fusion,
                            **{f"{part}_{k}": float(x) for part in ("elem", "scaled")
                               for k, x in c[part].items()},
                            m_equal=bool(c["m_equal"]), masked_equal=bool(c["masked_equal"])))
    return rows


def triton_interpreter_table(seeds=(0, 1, 2)) -> pd.DataFrame:
    """The facts, then the fidelity rows of tests/test_triton.py's case at `seeds`."""
    rows = interpreter_facts() + fidelity_rows((2, 2), 96, 110, (64,), ("fp16", "bf16", "fp32"),
                                               ("fa2", "exp2"), block=32, seeds=tuple(seeds))
    df = pd.DataFrame(rows)
    df["lead"] = df["lead"].map(lambda x: "x".join(map(str, x)) if isinstance(x, list) else None)
    return df
