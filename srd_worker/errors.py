"""Named exceptions for srdq, in one place.

Library code raises these; only the edges (CLI, Celery tasks) translate them into user-facing messages.
"""

from __future__ import annotations


class SrdqError(Exception):
    """Base class of every error srdq raises on purpose."""


class ConfigError(SrdqError):
    """A run spec, setting or method parameter is invalid (unknown name, wrong type, out of range)."""


class DatasetError(SrdqError):
    """A dataset file cannot be used. Carries the file, line (1-based) and field where known."""

    def __init__(
        self, message: str, *, path: str | None = None, line: int | None = None, field: str | None = None
    ) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.reason = message
        where = []
        if path is not None:
            where.append(str(path))
        if line is not None:
            where.append(f"line {line}")
        if field is not None:
            where.append(f"field '{field}'")
        super().__init__(f"{': '.join([', '.join(where), message]) if where else message}")


class EngineError(SrdqError):
    """The generation engine failed or was asked for something it cannot do."""


class EngineUnavailable(EngineError):
    """The engine's model server stayed unreachable (connection errors, timeouts, 429/5xx) for longer than
    its retry window. Not an item's fault: it ends the slice (a fleet worker releases the shard as pending
    without counting an attempt, ``srdq run`` exits and resumes when run again); it must never be turned
    into an item's error record."""


class CapabilityError(EngineError):
    """A method needs an engine capability (e.g. full logits, gradients) the engine does not declare."""


class ModelLoadError(EngineError):
    """A model or tokenizer could not be found or loaded."""


class RewardError(SrdqError):
    """A reward model failed or was configured wrongly."""


class StoreError(SrdqError):
    """The database store refused an operation (missing run, inconsistent state)."""


class ItemError(SrdqError):
    """One item cannot be processed (prompt longer than the context, grader failure); the run goes on."""


class ObjectStoreError(SrdqError):
    """The object store (S3 or a local folder) failed or holds something unexpected: an unreachable
    endpoint, a missing object, a refused key, or a result part whose size or sha256 does not match its
    manifest. The message names the bucket/key or path."""


class BrokerUnavailable(SrdqError):
    """The broker could not take a submit's messages; the run is stored and resumable."""
