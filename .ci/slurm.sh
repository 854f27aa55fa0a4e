#!/usr/bin/env bash
# The SLURM check: start a one-node SLURM cluster here (.ci/slurm-cluster.sh: Debian's
# slurm-wlm and munge, as root) and run tests/test_slurm.py against it: a 2-shard sweep
# through hydra/launcher=slurm compared with a one-process run, and a resume after scancel
# of one array task. Where root or apt-get is missing it says so and skips (exit 0).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
bash .ci/slurm-cluster.sh
rc=$?
if [ $rc = 3 ]; then
  echo "SLURM check SKIPPED: this machine has no root or no apt-get to start a cluster"
  exit 0
elif [ $rc != 0 ]; then
  echo "SLURM check FAILED: the one-node cluster did not start"; exit 1
fi
"$PY" -m pytest -q -p no:xdist -rs tests/test_slurm.py
rc=$?
bash .ci/slurm-cluster.sh stop
exit $rc
