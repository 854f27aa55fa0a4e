"""Capture the attention inputs of a Hugging Face transformers model, then measure one call.

    pip install -e .[hf]
    python examples/capture_hf.py --out acts.safetensors        # a tiny random Llama
    python -m flashnum.run distribution=captured distribution.path=acts.safetensors \\
        distribution.call=1 precision=bf16 policy=fa2

The model here is a randomly initialised tiny Llama (2 layers, 4 query heads sharing 2
key/value heads, head_dim 16), built from its config: no weights or data are downloaded.
Your own model goes through the same lines; load it with SDPA attention, e.g.

    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="sdpa")

transformers runs attention through torch's scaled_dot_product_attention when
attn_implementation is "sdpa" (its "eager" path multiplies and softmaxes by hand and is
not seen; flash_attention_2 calls flash-attn's kernel, not seen either). Each layer's
call is recorded under the module's name, "model.layers.<i>.self_attn"; grouped-query
K and V are stored expanded to the query heads (flashnum.inputs.capture).
"""

from __future__ import annotations

import argparse

import torch

import flashnum


def tiny_llama(seed: int = 0):
    """A randomly initialised 2-layer Llama with GQA and SDPA attention (no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, attn_implementation="sdpa")
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def capture_hf(model, ids: torch.Tensor, out, backward: bool = True, **limits):
    """Run the model on token ids inside flashnum.capture (the loss's backward too)."""
    with flashnum.capture(out, backward=backward, **limits) as cap:
        loss = model(ids, labels=ids).loss
        if backward:
            loss.backward()
    return cap


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="acts.safetensors", help="capture file to write")
    ap.add_argument("--seq-len", type=int, default=32, help="tokens in the batch's one row")
    ap.add_argument("--seed", type=int, default=0, help="model and token seed")
    ap.add_argument("--no-backward", action="store_true", help="forward calls only (no dO)")
    a = ap.parse_args(argv)
    model = tiny_llama(a.seed)
    ids = torch.randint(0, model.config.vocab_size, (1, a.seq_len),
                        generator=torch.Generator().manual_seed(a.seed))
    cap = capture_hf(model, ids, a.out, backward=not a.no_backward)
    for c in cap.calls:
        print(f"call {c.index}: {c.module} q {tuple(c.q.shape)} causal={c.causal} "
              f"scale={c.scale:.4g} dO={'yes' if c.do is not None else 'no'}")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
