"""Saving and loading inputs (Q, K, V and what made them) in a format that cannot run code.

    save_inputs(path, {"q": q, "k": k, "v": v}, meta)   # meta: a JSON-able dict
    tensors, meta = load_inputs(path)

The file is torch.save of a plain dict: each tensor under its name, "meta" the JSON
text of the metadata and "format" this module's FORMAT. It is read back with
torch.load(weights_only=True), which rebuilds tensors, strings and numbers only and
never calls into pickled code, so a file from elsewhere cannot run anything. (The
same content, tensors by name plus one string, is what safetensors stores; it is not
a dependency of flashnum.) JSON writes floats exactly (repr round-trips) and NaN as NaN.

flashnum.inputs.search saves its worst cases this way; make("worst_case", path=...)
(flashnum.inputs.distributions) replays them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

FORMAT = "flashnum.inputs/1"


def _jsonable(x):
    """What json.dumps cannot write itself: numpy scalars and arrays, tensors, paths."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (np.ndarray, torch.Tensor)):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"cannot save {type(x).__name__} {x!r} in inputs metadata (JSON only)")


def save_inputs(path: str | Path, tensors: dict, meta: dict) -> Path:
    """Write tensors (name -> torch.Tensor) and meta (JSON-able) to path; returns path."""
    path = Path(path)
    for name, t in tensors.items():
        if name in ("meta", "format") or not isinstance(t, torch.Tensor):
            raise TypeError(f"tensors[{name!r}] must be a torch.Tensor under a name other "
                            f"than meta and format, got {type(t).__name__}")
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    blob["meta"] = json.dumps(meta, sort_keys=True, default=_jsonable)
    blob["format"] = FORMAT
    torch.save(blob, path)
    return path


def load_inputs(path: str | Path) -> tuple[dict, dict]:
    """(tensors, meta) of a file written by save_inputs; ValueError for any other file."""
    path = Path(path)
    try:
        blob = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as e:  # a pickle with code in it, or not a torch file at all
        raise ValueError(f"{path} is not a flashnum inputs file ({FORMAT}): "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if not isinstance(blob, dict) or blob.get("format") != FORMAT:
        found = blob.get("format") if isinstance(blob, dict) else type(blob).__name__
        raise ValueError(f"{path} is not a flashnum inputs file: format {found!r}, "
                         f"expected {FORMAT!r}")
    meta = json.loads(blob["meta"])
    tensors = {k: v for k, v in blob.items() if k not in ("meta", "format")}
    return tensors, meta
