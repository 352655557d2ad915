"""`srdq calibrate` on the testbed's trained pair (a real model and its draft): EASD's entropy percentiles and
CSD's rejection pairs written to one JSON file, the ready `--set` lines printed; a greedy pass gives no
processed percentiles (its processed distributions are one-hot); bad options write nothing."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from srdq_cli.main import cli

from srd_worker.engines.loading import TESTBED_DIR

pytestmark = pytest.mark.unit

SPLIT = str(TESTBED_DIR / "data" / "calibration.jsonl")


def _calibrate(out, *extra: str):
    args = ["calibrate", SPLIT, "--model", "testbed", "--draft-model", "testbed-draft", "--limit", "3"]
    return CliRunner().invoke(cli, [*args, "--max-new-tokens", "24", "--out", str(out), *extra])


def test_greedy_calibration_writes_raw_percentiles_and_rejection_pairs(tmp_path):
    out = tmp_path / "calib.json"
    result = _calibrate(out, "--percentiles", "50,90")
    assert result.exit_code == 0, result.output
    rec = json.loads(out.read_text())
    assert rec["prompts"] == 3 and rec["positions"] > 0 and rec["settings"]["temperature"] == 0
    raw = rec["entropy_percentiles"]["raw"]
    top = math.log(209)  # the largest entropy over the testbed's 209-token vocabulary
    for model in ("draft", "target"):
        assert 0 <= raw[model]["50"] <= raw[model]["90"] <= top
    assert rec["entropy_percentiles"]["processed"] is None and "one-hot" in rec["processed_note"]
    assert rec["entropy_percentiles"]["tempered"] is None  # softmax(z / 0) is one-hot too
    assert sum(rec["pairs"].values()) == rec["mismatches"]
    assert all(d != t for d, t in (k.split(",") for k in rec["pairs"]))  # greedy: a rejection is a mismatch
    assert (
        f"P90: easd --set tau_q={raw['draft']['90']:.4f} --set tau_p={raw['target']['90']:.4f}"
        in result.output
    )
    assert f"csd --set memory={out}" in result.output


def test_sampled_calibration_gives_processed_percentiles(tmp_path):
    out = tmp_path / "calib.json"
    result = _calibrate(out, "--temperature", "0.8", "--percentiles", "80")
    assert result.exit_code == 0, result.output
    rec = json.loads(out.read_text())
    processed = rec["entropy_percentiles"]["processed"]
    assert processed["draft"]["80"] is not None and processed["target"]["80"] is not None
    assert "processed_note" not in rec
    # at temperature 0.8 < 1 every softmax is sharper than the raw one: lower entropies, lower percentiles
    tempered, raw = rec["entropy_percentiles"]["tempered"], rec["entropy_percentiles"]["raw"]
    for model in ("draft", "target"):
        assert 0 <= tempered[model]["80"] < raw[model]["80"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--percentiles", "50,120"], "--percentiles must be numbers in [0, 100]"),
        (["--percentiles", "high"], "--percentiles expects numbers like 70,80,90"),
        (["--temperature", "-1"], "--temperature >= 0"),
    ],
)
def test_bad_options_are_refused_and_write_nothing(tmp_path, extra, message):
    out = tmp_path / "calib.json"
    result = _calibrate(out, *extra)
    assert result.exit_code == 1 and message in result.output
    assert not out.exists()
