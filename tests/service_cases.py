"""What the fleet's unit tests (tests/unit/test_service_*.py) set up alike: a small sampling run on the tiny
random Llama, and a migrated SQLite database standing in for PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from srd_worker.spec import PreparedRun, prepare_run
from srd_worker.store.db import sqlite_url, upgrade


def tiny_sampling_run(datasets_dir: Path, **params: Any) -> PreparedRun:
    """Sampling with ``params`` over the first 2 GSM8K problems, on ``tiny-random-llama``, no reward."""
    return prepare_run(
        dataset=datasets_dir / "gsm8k_test.jsonl",
        method="sampling",
        params=params,
        model="tiny-random-llama",
        reward=None,
        limit=2,
    )


def migrated_sqlite(tmp_path: Path) -> str:
    """The URL of a new SQLite file under ``tmp_path`` with srdq's schema (every migration applied)."""
    url = sqlite_url(tmp_path / "fleet.db")
    upgrade(url)
    return url
