"""Logging for ``srdq run``, ``srdq submit`` and ``srdq worker``: a level, ``text`` or ``json`` lines, and
secrets masked in every line.

``setup_logging(level, fmt)`` configures the ``srdq`` loggers (and, for the worker, Celery's handlers
through ``apply_to_handlers``). JSON lines carry ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``msg``
and the structured fields a call passes in ``extra`` (``EVENT_FIELDS``: run id, shard, item counts,
tokens, durations, error), so a fleet's logs can be filtered by run and shard without parsing prose.

Secrets never reach a line: ``SecretFilter`` replaces the password of any ``scheme://user:password@``
URL with ``***`` and any configured secret value (the S3 secret key, the OpenAI API key) with ``***``,
in the message, its arguments and the structured fields alike.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from srd_worker.settings import Settings

#: Structured fields a log call may pass in ``extra`` (they become JSON keys; text lines append them).
EVENT_FIELDS = (
    "event",
    "run_id",
    "shard",
    "items",
    "done",
    "failed",
    "tokens",
    "rounds",
    "seconds",
    "compute_seconds",
    "tokens_per_s",
    "worker",
    "error",
)
LOG_FORMATS = ("text", "json")
_URL_PASSWORD = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)([^@/\s]+)(@)")


def mask(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with URL passwords and the given secret values replaced by ``***``."""
    out = _URL_PASSWORD.sub(r"\1***\3", text)
    for secret in secrets:
        if secret and len(secret) >= 4:
            out = out.replace(secret, "***")
    return out


class SecretFilter(logging.Filter):
    """Masks secrets in a record's message (arguments merged in first) and structured fields."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: log it as given
            message = str(record.msg)
        record.msg, record.args = mask(message, self.secrets), ()
        for name in EVENT_FIELDS:
            value = getattr(record, name, None)
            if isinstance(value, str):
                setattr(record, name, mask(value, self.secrets))
        if record.exc_info and not record.exc_text:
            record.exc_text = mask(logging.Formatter().formatException(record.exc_info), self.secrets)
        elif record.exc_text:
            record.exc_text = mask(record.exc_text, self.secrets)
        return True


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in EVENT_FIELDS if getattr(record, name, None) is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the structured fields, and exc (a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exc"] = record.exc_text
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``time level logger: message key=value ...``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items() if k != "event")
        return f"{text} [{extra}]" if extra else text


def formatter(fmt: str) -> logging.Formatter:
    if fmt not in LOG_FORMATS:
        from srd_worker.errors import ConfigError

        raise ConfigError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    return JsonFormatter() if fmt == "json" else TextFormatter()


def settings_secrets(settings: Settings) -> list[str]:
    """The secret values in ``settings`` that a line must never show."""
    out = []
    for name in ("aws_secret_access_key", "openai_api_key"):
        value: Any = getattr(settings, name, None)
        value = value.get_secret_value() if hasattr(value, "get_secret_value") else value
        if value:
            out.append(str(value))
    return out


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each line (a test runner swaps it)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def setup_logging(
    level: str = "WARNING", fmt: str = "text", *, stream: TextIO | None = None, secrets: Iterable[str] = ()
) -> logging.Handler:
    """Send the ``srdq`` loggers to ``stream`` (stderr) at ``level`` in ``fmt``, secrets masked. Returns the
    handler (replacing one an earlier call installed)."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        from srd_worker.errors import ConfigError

        raise ConfigError(f"unknown log level {level!r}; choose DEBUG, INFO, WARNING or ERROR")
    handler: logging.Handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler.setFormatter(formatter(fmt))
    handler.addFilter(SecretFilter(secrets))
    handler.set_name("srdq")
    root = logging.getLogger("srdq")
    for old in [h for h in root.handlers if h.get_name() == "srdq"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    return handler


def apply_to_handlers(logger: logging.Logger, fmt: str, secrets: Iterable[str] = ()) -> None:
    """Give every handler of ``logger`` srdq's format and secret filter (Celery's own handlers)."""
    for handler in logger.handlers:
        handler.setFormatter(formatter(fmt))
        handler.addFilter(SecretFilter(secrets))
