"""Per-item fault isolation: one bad item becomes an error row instead of failing its whole shard.

The runner steps every unfinished item of a shard in one ``method.step`` (one engine batch). When that
call raises, ``Isolation.step`` finds the failing item(s) by splitting the batch in halves and retrying
each half until the failure is pinned on single items:

- **item fault** (anything not listed below: a ``ValueError`` or ``RuntimeError`` from a tokenizer or
  model on one prompt, an ``EngineError``/``RewardError``, a server's 400/413/422 rejecting one prompt):
  the item alone still fails, so its state gets ``error`` (``"<Type>: <message>"``), ``done`` and a
  ``fault`` entry (round, kind, traceback); the runner checkpoints it like any other state and the
  record is an error row (``srdq export``: ``status=failed``; ``srdq status``: counted as failed; the
  report's *Failed items*). Every other item of the shard goes on.
- **out of memory** (``MemoryError``, ``torch.OutOfMemoryError``/``torch.cuda.OutOfMemoryError``, a
  ``RuntimeError`` saying "out of memory"): the batch limit is halved for the rest of the slice (the
  rest of this ``run_shard`` call; the next slice starts unlimited again) and the items are stepped in
  chunks of the lowered size. Only an item that runs out of memory alone is an item fault.
- **infrastructure fault** (``infrastructure_fault``): a lost database or broker connection, a
  connection refused/reset or timed out by a model server (the openai engine's ``EngineUnavailable``),
  a server's 5xx, 401/403/404/408/409/429,
  a broken CUDA context ("CUDA error", not OOM), a dead vLLM engine, a lost lease, a configuration
  error. Nothing is isolated: the exception propagates, the slice fails and is retried from the last
  checkpoint (``SRDQ_MAX_ATTEMPTS`` caps the retries), exactly as before isolation existed.
- **systemic fault**: when a round of two or more items ends with *every* item failing on its own,
  the fault is not the items' (a model server that breaks on everything, a misconfigured reward): the
  first error is raised as ``SystemicFault`` and the slice fails as for an infrastructure fault.

Determinism: before every attempt the attempted states are pickled; a failed attempt restores them in
place, so a retried item starts from exactly the state it had (no half-drafted candidates, no ledger
counts from the failed call). Every random draw is seeded per item, so a retried item draws what it
would have drawn in the full batch; only the batch composition differs, which matters as far as the
engine is not batch-invariant (docs/PERFORMANCE.md). The same faults give the same splits, so a run
with the same faults is reproduced exactly (a resumed shard too: error states are checkpointed).
"""

from __future__ import annotations

import gc
import logging
import pickle
import re
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from srd_worker.errors import EngineError

log = logging.getLogger("srdq.isolation")

ITEM, OOM, INFRA = "item", "oom", "infra"

#: Exception class names (anywhere in the class hierarchy) that mean the infrastructure failed, not the
#: item: database and broker drivers, HTTP client transport errors, a dead inference engine. Matched by
#: name so that optional libraries (openai, httpx, vllm, botocore) need not be imported to check.
INFRA_CLASS_NAMES = frozenset(
    {
        "ConnectionError",  # the builtin, redis-py's and requests' (none subclasses another)
        "Timeout",  # requests (ReadTimeout, ConnectTimeout)
        "SQLAlchemyError",  # sqlalchemy (OperationalError, InterfaceError, ...)
        "RedisError",  # redis-py
        "OperationalError",  # psycopg2 / DB-API drivers
        "InterfaceError",
        "LeaseLost",  # srd_worker.store.leases: another worker owns the shard now
        "StoreError",
        "ObjectStoreError",
        "ConfigError",  # a spec or reward configured wrongly fails every item alike
        "CapabilityError",
        "ModelLoadError",
        "APIConnectionError",  # openai (APITimeoutError is a subclass)
        "TransportError",  # httpx (ConnectError, ReadTimeout, ...)
        "TimeoutException",  # httpx
        "EndpointConnectionError",  # botocore
        "EngineDeadError",  # vLLM's engine core died
        "EngineUnavailable",  # srd_worker.errors: the openai engine's model server stayed down
    }
)

#: HTTP statuses that reject one request's content (an item fault); every other 4xx/5xx is the server's
#: or the account's problem (auth, unknown model, rate limit, overload) and fails the slice.
ITEM_HTTP_STATUSES = frozenset({400, 413, 422})


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


_HTTP_IN_MESSAGE = re.compile(r"\bHTTP (\d{3})\b")


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an exception carries: openai's ``status_code``, httpx/requests' ``response``, or
    ``HTTP NNN`` in its message (the openai engine's ``EngineError`` for a refused request)."""
    for holder in (exc, getattr(exc, "response", None)):
        status = getattr(holder, "status_code", None)
        if isinstance(status, int) and 100 <= status <= 599:
            return status
    match = _HTTP_IN_MESSAGE.search(str(exc))
    return int(match.group(1)) if match else None


def out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or "OutOfMemoryError" in _names(exc):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def infrastructure_fault(exc: BaseException) -> bool:
    """True for errors that are no single item's fault (see the module docstring)."""
    if isinstance(exc, ConnectionError | TimeoutError | SystemicFault):
        return True
    if _names(exc) & INFRA_CLASS_NAMES:
        return True
    status = http_status(exc)
    if status is not None and status >= 400:
        return status not in ITEM_HTTP_STATUSES
    return isinstance(exc, RuntimeError) and "cuda error" in str(exc).lower()


def classify(exc: BaseException) -> str:
    """``"oom"``, ``"infra"`` or ``"item"``."""
    if out_of_memory(exc):
        return OOM
    if infrastructure_fault(exc):
        return INFRA
    return ITEM


class SystemicFault(EngineError):
    """Every item of a round failed on its own: the engine or reward is broken, not the items."""


@dataclass
class ItemFault:
    item_id: str
    round: int  # the item's round when its step failed (0 = its first round)
    kind: str  # "item" or "oom" (out of memory even alone)
    error: str


@dataclass
class IsolationLog:
    """What isolation did during one ``run_shard`` call (one slice)."""

    splits: int = 0  # batches split in halves to find failing items
    retries: int = 0  # step calls beyond the first of each round (halves, OOM chunks)
    oom_events: int = 0
    batch_limit: int | None = None  # items per step call after OOMs (None: no limit)
    faults: list[ItemFault] = field(default_factory=list)


def _snapshot(states: Sequence[dict[str, Any]]) -> bytes:
    return pickle.dumps(list(states), protocol=pickle.HIGHEST_PROTOCOL)


def _restore(states: Sequence[dict[str, Any]], snapshot: bytes) -> None:
    """Put every state back as it was before the failed attempt, in place (the runner holds them)."""
    for state, before in zip(states, pickle.loads(snapshot), strict=True):
        state.clear()
        state.update(before)


def _free_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")  # never import torch here: only free what an engine allocated
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class Isolation:
    """Steps one round with fault isolation; keeps the lowered batch limit and the log for one slice."""

    def __init__(self) -> None:
        self.log = IsolationLog()

    def step(self, method: Any, states: list[dict[str, Any]], ctx: Any) -> list[ItemFault]:
        """``method.step(states, ctx)``, isolating item faults (module docstring). Marks each failing
        item's state as an error and returns the faults of this round; raises infrastructure and
        systemic faults (every state is then as it was before this call or as its last successful
        sub-batch left it; the runner checkpoints nothing of a round that raised)."""
        failures: list[tuple[dict[str, Any], BaseException, str]] = []
        splits, retries, ooms = self.log.splits, self.log.retries, self.log.oom_events
        self._run(method, states, ctx, failures, first=True)
        if failures and len(failures) == len(states) >= 2:
            state, exc, _ = failures[0]
            raise SystemicFault(
                f"all {len(states)} items of the round failed on their own, so the engine or reward is "
                f"at fault, not the items (first: item {state['item_id']}: {error_text(exc)})"
            ) from exc
        faults = []
        for state, exc, kind in failures:
            fault = ItemFault(str(state["item_id"]), int(state.get("round", 0)), kind, error_text(exc))
            state["error"] = fault.error
            state["done"] = True
            state["fault"] = {
                "round": fault.round,
                "kind": kind,
                "traceback": "".join(traceback.format_exception(exc, limit=-3)),
            }
            log.warning(
                "item %s failed at its round %d (%s): %s", fault.item_id, fault.round, kind, fault.error
            )
            faults.append(fault)
        self.log.faults.extend(faults)
        if faults or self.log.splits > splits or self.log.oom_events > ooms:  # not every chunked round
            log.warning(
                "round of %d items: %d split(s), %d extra step call(s), batch limit %s, isolated: %s",
                len(states),
                self.log.splits - splits,
                self.log.retries - retries,
                self.log.batch_limit or "none",
                ", ".join(f.item_id for f in faults) or "none",
            )
        return faults

    def _run(
        self,
        method: Any,
        states: list[dict[str, Any]],
        ctx: Any,
        failures: list[tuple[dict[str, Any], BaseException, str]],
        first: bool = False,
    ) -> None:
        """Step ``states`` in chunks of the current batch limit (read again after every chunk)."""
        start = 0
        while start < len(states):
            size = self.log.batch_limit or len(states)
            self._attempt(method, states[start : start + size], ctx, failures, first=first and start == 0)
            start += size

    def _attempt(
        self,
        method: Any,
        group: list[dict[str, Any]],
        ctx: Any,
        failures: list[tuple[dict[str, Any], BaseException, str]],
        first: bool,
    ) -> None:
        if not first:
            self.log.retries += 1
        snapshot = _snapshot(group)
        try:
            method.step(group, ctx)
            return
        except Exception as exc:  # noqa: BLE001 - classified below; infrastructure faults re-raised
            _restore(group, snapshot)
            kind = classify(exc)
            if kind == INFRA:
                raise
            if kind == OOM:
                self.log.oom_events += 1
                _free_memory()
                if len(group) > 1:
                    limit = max(1, len(group) // 2)
                    if self.log.batch_limit is None or limit < self.log.batch_limit:
                        self.log.batch_limit = limit
                    log.warning(
                        "out of memory stepping %d items (%s): batch limit lowered to %d for the rest "
                        "of the slice",
                        len(group),
                        error_text(exc),
                        self.log.batch_limit,
                    )
                    self._run(method, group, ctx, failures)
                    return
            if len(group) == 1:
                failures.append((group[0], exc, kind))
                return
            self.log.splits += 1
            mid = len(group) // 2
            log.warning(
                "step of %d items failed (%s): retrying its halves to isolate the failing item(s)",
                len(group),
                error_text(exc),
            )
            self._attempt(method, group[:mid], ctx, failures, first=False)
            self._attempt(method, group[mid:], ctx, failures, first=False)
