"""A user's own question, asked as a new user asks it: an ad-hoc sweep from overrides,
read back whole; a renamed copy of a shipped experiment in the user's own folder, run by
its name; one line and exit status 2 for a mistyped experiment or a folder that is not a
store. Every command runs from a folder outside the repository."""

import os
import subprocess
import sys
from pathlib import Path

from flashnum.harness import store

REPO = Path(__file__).resolve().parents[1]
# small cases: 32 queries, head_dim 16, blocks of 16 keys (late_max needs two)
SMALL = ["shape.seq_len_q=32", "shape.head_dim=16", "tiling.block_n=16", "progress=false",
         "n_jobs=1"]


def flashnum(*args, cwd, timeout=300):
    """python -m flashnum.<args> from `cwd`, with this checkout's flashnum importable."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_a_2_by_2_multirun_reads_back_as_4_rows(tmp_path):
    p = flashnum("flashnum.run", "-m", "precision=fp16", "policy=lowp",
                 "shape.seq_len_k=32,64", "distribution=gaussian,late_max", *SMALL,
                 "store.root=S", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    df = store.load("single", root=tmp_path / "S")
    assert len(df) == 4
    assert sorted(zip(df.seq_len_k, df.distribution, strict=True)) == [
        (32, "gaussian"), (32, "late_max"), (64, "gaussian"), (64, "late_max")]
    # the view of the grid last run: the last job's one case
    assert len(store.load("single", root=tmp_path / "S", grid=True)) == 1
