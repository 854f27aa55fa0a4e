"""Installs tests/orders/perturb.py in every Python process started with this folder on
PYTHONPATH and FLASHNUM_TEST_ORDERS=1 (the runner's spawned workers included)."""

import os
import sys

if os.environ.get("FLASHNUM_TEST_ORDERS") == "1":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import perturb

    perturb.install()
