"""ONNX Runtime's CPU attention kernels as audit targets.

    from flashnum.audit.targets_ort import ort_attention, ort_mha
    out = ort_attention(q, k, v, causal=True)        # torch (B, H, N, d) in, torch out

  ort_attention  ONNX's standard Attention operator (opset 23), Q, K, V in its 4-D
                 (B, H, N, d) layout, `scale` and `is_causal` as attributes. The
                 operator's causal mask is top-left (the upper-left causal bias of
                 the ONNX specification).
  ort_mha        com.microsoft.MultiHeadAttention (ONNX Runtime's contrib operator):
                 query, key and value in (B, N, H * d), `num_heads`, `scale` and
                 `unidirectional` (causal) as attributes.

Each is one single-node model run by an InferenceSession on the CPU execution provider
(default session options: graph optimisations on, ONNX Runtime's own thread pool), one
session per (shape, dtype, causal, scale), cached. fp32 and fp16; ONNX Runtime's CPU
kernels register no bfloat16 attention, so bf16 raises (the audit's crash rule). The
kernels are inference kernels: no gradient.
"""

from __future__ import annotations

import functools
import math

import torch

_ONNX_TYPE = {torch.float32: 1, torch.float16: 10, torch.bfloat16: 16}  # TensorProto enums
OPSET = 23


def _session(model):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # no warnings on stderr for every session
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


@functools.lru_cache(maxsize=64)
def _attention_session(shape_q, shape_k, shape_v, dtype, causal, scale):
    from onnx import helper

    t = _ONNX_TYPE[dtype]
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], is_causal=int(causal),
                            scale=scale)
    graph = helper.make_graph(
        [node], "attention",
        [helper.make_tensor_value_info(n, t, list(s))
         for n, s in (("Q", shape_q), ("K", shape_k), ("V", shape_v))],
        [helper.make_tensor_value_info("Y", t, list(shape_q[:-1]) + [shape_v[-1]])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 10
    return _session(model)


@functools.lru_cache(maxsize=64)
def _mha_session(shape_q, shape_k, shape_v, heads, dtype, causal, scale):
    from onnx import helper

    t = _ONNX_TYPE[dtype]
    node = helper.make_node("MultiHeadAttention", ["query", "key", "value"], ["output"],
                            domain="com.microsoft", num_heads=heads, scale=scale,
                            unidirectional=int(causal))
    graph = helper.make_graph(
        [node], "mha",
        [helper.make_tensor_value_info(n, t, list(s))
         for n, s in (("query", shape_q), ("key", shape_k), ("value", shape_v))],
        [helper.make_tensor_value_info("output", t, list(shape_q[:-1]) + [shape_v[-1]])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return _session(model)


def _np(x: torch.Tensor):
    x = x.detach().to("cpu").contiguous()
    if x.dtype == torch.bfloat16:
        import ml_dtypes

        return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return x.numpy()


def _torch(a, dtype) -> torch.Tensor:
    import numpy as np

    if dtype == torch.bfloat16:
        return torch.from_numpy(np.asarray(a).view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.asarray(a).copy())


def _scale(q, scale) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def ort_attention(q, k, v, causal=False, scale=None):
    """ONNX Attention (opset 23) on ONNX Runtime's CPU provider; (B, H, N, d) in and out."""
    sess = _attention_session(tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype,
                              bool(causal), _scale(q, scale))
    (y,) = sess.run(None, {"Q": _np(q), "K": _np(k), "V": _np(v)})
    return _torch(y, q.dtype)


def ort_mha(q, k, v, causal=False, scale=None):
    """com.microsoft.MultiHeadAttention on the CPU provider; (B, H, N, d) in and out
    (the operator's (B, N, H * d) layout inside)."""
    b, h, nq, d = q.shape
    dv = v.shape[-1]

    def flat(x):
        return x.transpose(1, 2).reshape(b, x.shape[-2], h * x.shape[-1])

    qf, kf, vf = flat(q), flat(k), flat(v)
    sess = _mha_session(tuple(qf.shape), tuple(kf.shape), tuple(vf.shape), h, q.dtype,
                        bool(causal), _scale(q, scale))
    (y,) = sess.run(None, {"query": _np(qf), "key": _np(kf), "value": _np(vf)})
    return _torch(y, q.dtype).reshape(b, nq, h, dv).transpose(1, 2).contiguous()
