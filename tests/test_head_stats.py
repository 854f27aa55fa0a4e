"""python -m flashnum.studies.head_stats: the logit statistics of every input of a forward
experiment, one row per (input, batch, head), stored with a manifest."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashnum import store
from flashnum.inputs.distributions import make
from flashnum.store import manifest

REPO = Path(__file__).resolve().parents[1]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "flashnum.studies.head_stats", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_every_input_of_the_grid_is_described_once_per_head(tmp_path):
    p = cli("smoke", f"store.root={tmp_path}")
    assert p.returncode == 0, p.stderr
    df = store.load(tmp_path / "smoke_stats")
    # smoke: 2 distributions x 2 key lengths x 3 seeds; policies and precisions share inputs
    assert len(df) == 12 and df.case_id.is_unique
    assert set(df.distribution) == {"gaussian", "late_max"}
    for _, r in df.iterrows():
        x = make(r.distribution, seq_len_q=int(r.seq_len_q), seq_len_k=int(r.seq_len_k),
                 head_dim=int(r.head_dim), seed=int(r.seed), block_n=int(r.block_n),
                 **json.loads(r.dist_params))
        s = (x.q @ x.k.transpose(-1, -2)) * x.softmax_scale  # torch's matmul, not the module's
        p = torch.softmax(s, dim=-1)
        assert abs(r.max_logit - float(s.max())) <= 1e-12 * abs(float(s.max()))
        assert abs(r.sink_mass - float(p[..., 0].mean())) <= 1e-12
    late = df[df.distribution == "late_max"]
    assert (late.sink_argmax == 0).all()  # late_max puts every row's max in the last block
    (run,) = manifest.runs(tmp_path / "smoke_stats" / "manifest.json")
    assert run["command"] == {"module": "flashnum.run", "overrides": ["experiment=smoke_stats"]}


@pytest.mark.slow
def test_an_unknown_or_backward_experiment_is_one_line_with_status_2(tmp_path):
    for name in ("smok", "bwd_order"):
        p = cli(name, f"store.root={tmp_path}")
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        # the command is an alias of python -m flashnum.run experiment=NAME_stats
        assert f"unknown experiment '{name}_stats'" in p.stderr and "smoke" in p.stderr
