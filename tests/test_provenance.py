"""The stored tables the documents quote were written from clean commits: each manifest's
last run records a git tree without uncommitted changes."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["kernel_audit_backward", "trained_model",
                                  "trained_model_stats", "bwd_trained_model"])
def test_the_stored_run_was_made_from_a_clean_commit(name):
    run = json.loads((ROOT / "experiments" / name / "manifest.json").read_text())["runs"][-1]
    assert run["git"]["dirty"] is False
