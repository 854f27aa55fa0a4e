"""A small decoder-only transformer trained on the Python standard library's own sources.

Its only purpose is to give flashnum attention inputs with learnt structure (sinks on the
first key, peaked heads, outlier channels in q and k) made on this machine from text that
ships with the interpreter, with nothing downloaded. It is not part of the library and
nothing in flashnum imports it.

Model: byte-level tokens (256 bytes + a BOS token that starts every sequence), pre-norm
blocks (RMSNorm, rotary positions, SwiGLU MLP) in the LLaMA layout, untied output head.
Attention is torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) with
its default scale 1/sqrt(head_dim), so flashnum.capture records every call.

Data: every .py file under the running interpreter's standard library directory
(sysconfig "stdlib", site-packages excluded), in sorted path order, each file preceded by
its relative path as a comment line; files whose sha256 of the path falls in the first
1/64 of the hash space form the validation split. Training windows of `context` bytes are
drawn uniformly from the training text by a seeded torch.Generator.

Train (the command the README quotes; seeded, checkpoints every `--ckpt-every` seconds so
a run cut by the wall-clock cap still leaves a model; rerunning with --stop-after set to the
step count it reached reproduces it on the same machine and thread count):

    nice -n 10 python models/stdlib_lm.py train --out scratch/stdlib_lm_run --minutes 30
    nice -n 10 python models/stdlib_lm.py capture --run scratch/stdlib_lm_run

The run directory gets model.safetensors (fp32 weights), config.json and log.json (loss
curve: step, tokens, wall and CPU seconds, train and validation loss in nats per byte).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

BOS = 256
VOCAB = 257


@dataclass
class Config:
    n_layer: int = 4
    d_model: int = 256
    n_head: int = 4
    context: int = 1024
    rope_base: float = 10000.0
    mlp_hidden: int = 704  # SwiGLU width ~ 8/3 d_model, rounded to a multiple of 64


def rope_tables(cfg: Config, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    d = cfg.d_model // cfg.n_head
    inv = cfg.rope_base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # rotate-half convention (GPT-NeoX / LLaMA in transformers): pairs (i, i + d/2)
    x1, x2 = x.chunk(2, dim=-1)
    c = torch.cat([cos, cos], dim=-1)
    s = torch.cat([sin, sin], dim=-1)
    return x * c + torch.cat([-x2, x1], dim=-1) * s


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x, cos, sin):
        b, n, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (t.view(b, n, self.n_head, c // self.n_head).transpose(1, 2)
                   for t in (q, k, v))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.norm2 = nn.RMSNorm(cfg.d_model)
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.mlp_hidden, bias=False)
        self.down = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        g, u = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class StdlibLM(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(VOCAB, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = nn.RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, VOCAB, bias=False)
        cos, sin = rope_tables(cfg, cfg.context)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # GPT-2 init; residual projections scaled by 1/sqrt(2 n_layer)
                std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith(("proj.weight",
                                                                           "down.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        n = idx.shape[1]
        x = self.embed(idx)
        cos, sin = self.cos[:n], self.sin[:n]
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return self.head(self.norm(x))


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py")
                  if "site-packages" not in p.parts and "dist-packages" not in p.parts)


def corpus() -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(train bytes, validation bytes, description) of the standard library's .py sources."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts: dict[str, list[bytes]] = {"train": [], "val": []}
    for p in stdlib_files():
        rel = p.relative_to(root).as_posix()
        split = "val" if hashlib.sha256(rel.encode()).digest()[0] < 4 else "train"
        parts[split].append(f"# {rel}\n".encode() + p.read_bytes() + b"\n")
    train = torch.frombuffer(bytearray(b"".join(parts["train"])), dtype=torch.uint8)
    val = torch.frombuffer(bytearray(b"".join(parts["val"])), dtype=torch.uint8)
    desc = {"root": str(root), "python": sys.version.split()[0],
            "files": {k: len(v) for k, v in parts.items()},
            "bytes": {"train": int(train.numel()), "val": int(val.numel())},
            "sha256": hashlib.sha256(bytes(train.numpy()) + bytes(val.numpy())).hexdigest()}
    return train, val, desc


def batch(data: torch.Tensor, b: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """b windows: BOS then n bytes; the model reads the first n tokens and predicts the next."""
    start = torch.randint(0, data.numel() - n, (b,), generator=gen)
    rows = torch.stack([data[s:s + n] for s in start.tolist()]).long()
    return torch.cat([torch.full((b, 1), BOS, dtype=torch.long), rows], dim=1)


def loss_of(model: StdlibLM, tok: torch.Tensor) -> torch.Tensor:
    logits = model(tok[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), tok[:, 1:].reshape(-1))


@torch.no_grad()
def val_loss(model: StdlibLM, val: torch.Tensor, n_batches: int, b: int) -> float:
    gen = torch.Generator().manual_seed(12345)  # the same windows at every evaluation
    model.eval()
    out = sum(loss_of(model, batch(val, b, model.cfg.context, gen)).item()
              for _ in range(n_batches)) / n_batches
    model.train()
    return out


def save(model: StdlibLM, out: Path, log: dict) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "model.safetensors.tmp"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
    os.replace(tmp, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(asdict(model.cfg), indent=1) + "\n")
    (out / "log.json.tmp").write_text(json.dumps(log, indent=1) + "\n")
    os.replace(out / "log.json.tmp", out / "log.json")


def load(run_dir: str | Path) -> StdlibLM:
    """The model saved in a run directory, in eval mode."""
    from safetensors.torch import load_file

    run_dir = Path(run_dir)
    cfg = Config(**json.loads((run_dir / "config.json").read_text()))
    model = StdlibLM(cfg)
    model.load_state_dict(load_file(str(run_dir / "model.safetensors")))
    return model.eval()


def capture(a: argparse.Namespace) -> None:
    """Capture the trained model's attention calls on held-out text (see CAPTURE)."""
    import flashnum
    from flashnum.analysis.logit_stats import head_stats
    from flashnum.inputs.capture import CapturedCall, save_capture

    torch.set_num_threads(a.threads)
    t0 = time.time()
    model = load(a.run)
    n = model.cfg.context
    _, val, desc = corpus()
    gen = torch.Generator().manual_seed(a.seed)
    tok = batch(val, 1, n, gen)  # BOS + n bytes; the model reads BOS + n - 1 of them
    x, y = tok[:, :-1], tok[:, 1:]
    with flashnum.capture(None, backward=True) as cap:
        # the loss summed over the n predicted bytes (n times the mean): the loss scaling
        # fp16 training needs, so that dO stays mostly above fp16's smallest normal number
        loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1), reduction="sum")
        loss.backward()
    loss = loss / n
    if len(cap.calls) != model.cfg.n_layer:
        raise RuntimeError(f"expected {model.cfg.n_layer} attention calls, recorded "
                           f"{len(cap.calls)}")
    kept, heads_table = [], []
    for layer, c in enumerate(cap.calls):
        st = head_stats(c.q, c.k, c.v, scale=c.scale, causal=True)
        for r in st:
            heads_table.append({"layer": layer, **r})
        sink = [r["sink_mass"] for r in st]
        # the head that leans on key 0 the most and the one that leans on it the least
        heads = sorted({max(range(len(sink)), key=sink.__getitem__),
                        min(range(len(sink)), key=sink.__getitem__)})
        rows = list(range(n - a.rows, n))  # the last rows: the longest contexts
        kept.append(CapturedCall(
            index=c.index, module=c.module, module_type=c.module_type,
            q=c.q[:, heads][:, :, rows].contiguous(), k=c.k[:, heads].contiguous(),
            v=c.v[:, heads].contiguous(), do=c.do[:, heads][:, :, rows].contiguous(),
            is_causal=c.is_causal, causal=True, scale=c.scale, scale_given=c.scale_given,
            heads=heads, rows=rows, shape=c.shape, dtype=c.dtype))
    save_capture(a.out, kept)
    for r in heads_table:
        r["kept"] = r["head"] in kept[r["layer"]].heads
    info = {"command": "python models/stdlib_lm.py capture " + " ".join(sys.argv[2:]),
            "tokens": x[0].tolist(), "loss": round(loss.item(), 4), "seed": a.seed,
            "rows": a.rows, "context": n,
            "corpus_sha256": desc["sha256"], "wall_s": round(time.time() - t0, 1),
            "training": json.loads((Path(a.run) / "log.json").read_text()),
            "heads": heads_table}
    Path(a.info).write_text(json.dumps(info, indent=1) + "\n")
    print(f"{len(kept)} calls, heads {[c.heads for c in kept]}, rows {rows[0]}..{rows[-1]}: "
          f"{a.out} ({Path(a.out).stat().st_size / 2**20:.1f} MiB), {a.info}; "
          f"loss {loss.item():.3f} nats/byte, {info['wall_s']} s")


def train(a: argparse.Namespace) -> None:
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    cfg = Config(n_layer=a.layers, d_model=a.d_model, n_head=a.heads, context=a.context)
    model = StdlibLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    tr, va, desc = corpus()
    gen = torch.Generator().manual_seed(a.seed)
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    log = {"config": asdict(cfg), "params": n_params, "seed": a.seed, "batch": a.batch,
           "lr": a.lr, "warmup": a.warmup, "steps_planned": a.steps, "minutes_cap": a.minutes,
           "threads": a.threads, "autocast": a.autocast,
           "load_average_at_start": os.getloadavg(), "corpus": desc, "torch": torch.__version__,
           "curve": [], "steps_done": 0, "stopped_by": None}
    print(f"{n_params / 1e6:.2f} M parameters; corpus {desc['bytes']} bytes "
          f"({desc['files']} files)", flush=True)
    t0, c0 = time.time(), time.process_time()
    last_ckpt = t0
    step = 0
    run_loss = None
    while True:
        # linear warmup, then cosine to 10% over the planned steps
        frac = min(step / max(a.steps, 1), 1.0)
        lr = a.lr * min(1.0, (step + 1) / a.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(
            math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        # bf16 autocast (AMX matmuls here, as mixed-precision training does on GPUs);
        # the weights and the optimizer stay fp32, and the capture runs the model in fp32
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            loss = loss_of(model, batch(tr, a.batch, cfg.context, gen))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        run_loss = loss.item() if run_loss is None else 0.9 * run_loss + 0.1 * loss.item()
        wall = time.time() - t0
        last = min(a.steps, a.stop_after or a.steps)
        done = step >= last or wall >= 60 * a.minutes
        if step % a.log_every == 0 or done:
            entry = {"step": step, "tokens": step * a.batch * cfg.context,
                     "wall_s": round(wall, 1), "cpu_s": round(time.process_time() - c0, 1),
                     "lr": lr, "train_loss": round(loss.item(), 4),
                     "train_loss_ema": round(run_loss, 4)}
            if step % (a.log_every * a.val_every) == 0 or done:
                entry["val_loss"] = round(val_loss(model, va, a.val_batches, a.batch), 4)
            log["curve"].append(entry)
            print(json.dumps(entry), flush=True)
        if done or time.time() - last_ckpt >= a.ckpt_every:
            log["steps_done"] = step
            log["wall_s"] = round(time.time() - t0, 1)
            log["cpu_s"] = round(time.process_time() - c0, 1)
            log["stopped_by"] = ("steps" if step >= last else "minutes") if done else None
            save(model, Path(a.out), log)
            last_ckpt = time.time()
        if done:
            break


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train from scratch (seeded)")
    t.add_argument("--out", required=True, help="run directory (weights, config, loss log)")
    t.add_argument("--minutes", type=float, default=30.0, help="wall-clock cap")
    t.add_argument("--steps", type=int, default=400, help="planned steps (cosine schedule)")
    t.add_argument("--stop-after", type=int, default=None,
                   help="stop after this many steps, on the schedule of --steps (what remakes "
                        "a run the wall-clock cap cut: its steps_done)")
    t.add_argument("--batch", type=int, default=4)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--warmup", type=int, default=30)
    t.add_argument("--layers", type=int, default=4)
    t.add_argument("--d-model", type=int, default=256)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--context", type=int, default=1024)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--autocast", choices=("bf16", "none"), default="bf16")
    t.add_argument("--log-every", type=int, default=10)
    t.add_argument("--val-every", type=int, default=5, help="in units of --log-every")
    t.add_argument("--val-batches", type=int, default=4)
    t.add_argument("--ckpt-every", type=float, default=120.0, help="seconds")
    c = sub.add_parser("capture", help="capture a trained model's attention calls")
    c.add_argument("--run", required=True, help="the training run directory")
    c.add_argument("--out", default="models/stdlib_lm.capture.safetensors")
    c.add_argument("--info", default="models/stdlib_lm.json",
                   help="the model's loss curve and every head's logit statistics")
    c.add_argument("--rows", type=int, default=128, help="query rows kept (the last ones)")
    c.add_argument("--seed", type=int, default=0, help="which held-out window")
    c.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    if a.cmd == "capture":
        if not (Path(a.run) / "model.safetensors").is_file():
            ap.error(f"--run {a.run} holds no model.safetensors (train one first)")
        context = json.loads((Path(a.run) / "config.json").read_text())["context"]
        if not 1 <= a.rows <= context:
            ap.error(f"--rows must be in 1..{context} (the model's context), got {a.rows}")
        capture(a)
        return 0
    if a.stop_after is not None and a.stop_after <= 0:
        ap.error(f"--stop-after must be positive, got {a.stop_after}")
    for name in ("minutes", "steps", "batch", "lr", "layers", "d_model", "heads", "context"):
        if getattr(a, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive, got {getattr(a, name)}")
    if a.d_model % a.heads or (a.d_model // a.heads) % 2:
        ap.error(f"--d-model {a.d_model} must split into --heads {a.heads} even head dims")
    train(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
