"""srdq's log lines (srd_worker/logs.py): levels, text or JSON objects with the run's structured fields,
secrets masked everywhere; `srdq run --log-format json` as a user runs it."""

from __future__ import annotations

import io
import json
import logging

import pytest

from srd_worker.errors import ConfigError
from srd_worker.logs import JsonFormatter, SecretFilter, apply_to_handlers, mask, setup_logging
from tests.cli import run_srdq

pytestmark = pytest.mark.unit


def test_mask_hides_url_passwords_and_secret_values():
    line = "db postgresql+psycopg2://srdq:hunter2@db:5432/srdq, broker redis://:pw99@r:6379/0, key AKIAsecretvalue"
    out = mask(line, ["AKIAsecretvalue"])
    assert "hunter2" not in out and "AKIAsecretvalue" not in out and "pw99" not in out
    assert "postgresql+psycopg2://srdq:***@db:5432/srdq" in out
    assert mask("no secrets here, s3://bucket/x") == "no secrets here, s3://bucket/x"


def _logger(fmt: logging.Formatter, secrets=()) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(fmt)
    handler.addFilter(SecretFilter(secrets))
    logger = logging.getLogger(f"srdq.test.{id(stream)}")
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, stream


def test_json_lines_carry_the_structured_fields_and_mask_secrets():
    logger, stream = _logger(JsonFormatter(), secrets=["s3cr3tKEY"])
    logger.info(
        "shard %s finished with %s",
        3,
        "postgresql://u:pw@h/db",
        extra={
            "event": "shard_finished",
            "run_id": "run-1",
            "shard": 3,
            "tokens": 120,
            "error": "key s3cr3tKEY",
        },
    )
    try:
        raise RuntimeError("boom s3cr3tKEY")
    except RuntimeError:
        logger.exception("failed", extra={"run_id": "run-1"})
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["msg"] == "shard 3 finished with postgresql://u:***@h/db"
    assert (first["event"], first["run_id"], first["shard"], first["tokens"]) == (
        "shard_finished",
        "run-1",
        3,
        120,
    )
    assert first["level"] == "INFO" and first["ts"].endswith("+00:00")
    assert first["error"] == "key ***"
    assert second["level"] == "ERROR" and "RuntimeError: boom ***" in second["exc"]
    assert "s3cr3tKEY" not in stream.getvalue()


@pytest.fixture
def srdq_logger():
    """setup_logging changes the process-wide ``srdq`` logger: put it back for the other tests (caplog)."""
    root = logging.getLogger("srdq")
    saved = (list(root.handlers), root.level, root.propagate)
    yield
    root.handlers, root.level, root.propagate = saved[0], saved[1], saved[2]


def test_setup_logging_levels_and_bad_values(srdq_logger):
    stream = io.StringIO()
    setup_logging("warning", "text", stream=stream)
    log = logging.getLogger("srdq.test.levels")
    log.info("hidden")
    log.warning("shown", extra={"run_id": "run-9"})
    assert "hidden" not in stream.getvalue() and "shown [run_id=run-9]" in stream.getvalue()
    with pytest.raises(ConfigError, match="unknown log level"):
        setup_logging("LOUD", "text", stream=stream)
    with pytest.raises(ConfigError, match="log format must be one of text, json"):
        setup_logging("INFO", "xml", stream=stream)


def test_celery_handlers_get_the_format_and_the_filter():
    logger = logging.getLogger("srdq.test.celery")
    stream = io.StringIO()
    logger.handlers = [logging.StreamHandler(stream)]
    logger.propagate = False
    apply_to_handlers(logger, "json", ["tok3nvalue"])
    logger.warning("token tok3nvalue seen")
    assert json.loads(stream.getvalue())["msg"] == "token *** seen"


def test_run_logs_json_lines_per_shard(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(f'{{"question": "What is {i}+1?", "answer": "#### {i + 1}"}}\n' for i in range(3))
    )
    out = tmp_path / "out"
    proc = run_srdq(
        "run", str(data), "--task", "gsm8k", "--method", "sampling", "--model", "tiny-random-llama",
        "--max-new-tokens", "8", "--shard-size", "2", "--out", str(out), "--log-format", "json", "--log-level", "INFO",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    shards = [e for e in events if e.get("event") == "shard_finished"]
    assert [e["shard"] for e in shards] == [0, 1] and [e["items"] for e in shards] == [2, 1]
    assert all(e["run_id"].startswith("run-") and e["tokens"] > 0 for e in shards)
    (finished,) = [e for e in events if e.get("event") == "run_finished"]
    assert finished["items"] == 3 and finished["done"] == 3
