"""Where the files srdq ships with live (a leaf: imports nothing of srdq). Every reader of a shipped file
takes its location from here, so no plugin package imports an application package for a constant."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent

#: The reference datasets (GSM8K, MATH500, ...; ``srd_worker/datasets/data``, see its README.md).
DATASETS_DIR: Path = _PACKAGE / "datasets" / "data"
#: The CPU testbed's committed build (data splits, policy, draft, rm, manifest.json).
TESTBED_ARTIFACTS_DIR: Path = _PACKAGE / "testbed" / "artifacts"
