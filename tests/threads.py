"""The threads a test's in-process torch runs on: two (this project's machines have two cores), or
``OMP_NUM_THREADS`` where it is set. ``make test`` sets it to 1 for its two pytest-xdist workers: two
processes of two OpenMP threads each on two cores spin against each other (SmolLM2's tests ran 5-10x
slower so)."""

from __future__ import annotations

import os

TORCH_THREADS = int(os.environ.get("OMP_NUM_THREADS") or 2)
