"""The score cache: reward scores by content, in the run store (README, *Score cache*).

A reward score is a pure function of the reward model (its weights, its parameters, srdq's adapter code)
and of what it scores: the question text, the response text (rewards score text, never the policy's
token ids: two token sequences that decode to the same text get the same score) and, for rewards that
take it, whether the response is finished. ``score_key`` hashes exactly that, under a ``reward`` identity
(``provenance.score_identity``: name, revision, parameters, dtype and device; for rewards that score with
the policy, the policy's revision and engine settings), into a sha256 ``key`` of the ``score_cache``
table. The table is shared by every run of the store (one SQLite file embedded, the fleet's PostgreSQL),
so a run reuses the scores of any earlier run with the same reward: rejection sampling after SRD with the
same seeds, an SRD threshold sweep, a rerun with another method.

``SqlScoreCache`` is what the runner gives the step context (``methods.base.ScoreCache``):

- ``lookup`` reads the keys of one reward batch (chunks of ``LOOKUP_CHUNK``), the scores added in this
  process and not written yet included;
- ``add`` keeps new scores in memory; ``flush`` (the runner calls it right after each round's
  checkpoint is committed) inserts them, insert-or-nothing, so two workers writing one key both succeed.
  A round that is not checkpointed (a crash, a lost lease) leaves no score behind, so a resumed round
  finds exactly what the uninterrupted one found.
- A database error in ``lookup`` or ``flush`` (e.g. a fleet database not upgraded yet, ``srdq db
  upgrade``) is logged once and turns the cache off for the rest of the process's run: the cache saves
  work, it never stops a run.

Only finite scores are stored (``StepContext.score``). Hits are not reward calls: the ledger counts them
apart (``rm_cache_hits``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence

from sqlalchemy import Engine
from sqlmodel import col, select

from srd_worker.store.db import session_scope
from srd_worker.store.models import ScoreCacheRow, utcnow

log = logging.getLogger("srdq.score_cache")

#: Keys per ``IN (...)`` query (SQLite's default limit on bound variables is 32766; PostgreSQL's 65535).
LOOKUP_CHUNK = 500


def score_key(reward: str, question: str, response: str, finished: bool) -> str:
    """The sha256 hex of one scored input under the reward identity ``reward``. Fields are length-prefixed,
    so no two different inputs share their bytes."""
    h = hashlib.sha256()
    for part in (reward, question, response):
        data = part.encode("utf-8", "surrogatepass")
        h.update(f"{len(data)}:".encode())
        h.update(data)
    h.update(b"F1" if finished else b"F0")
    return h.hexdigest()


class SqlScoreCache:
    """The ``score_cache`` table as the step context's ``ScoreCache`` for one reward identity.

    ``reward`` is the identity hash (``provenance.score_identity``'s ``hash``). ``hits`` / ``misses`` /
    ``written`` count this object's lookups and inserts (for benchmarks and logs)."""

    def __init__(self, engine: Engine, reward: str) -> None:
        self.engine = engine
        self.reward = reward
        self.pending: dict[str, float] = {}
        self.enabled = True
        self.hits = 0
        self.misses = 0
        self.written = 0

    def key(self, question: str, response: str, finished: bool) -> str:
        return score_key(self.reward, question, response, finished)

    def _off(self, what: str, exc: Exception) -> None:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        log.warning("score cache off for the rest of this run: %s failed: %s", what, first)
        self.enabled = False
        self.pending.clear()

    def lookup(self, keys: Sequence[str]) -> dict[str, float]:
        if not self.enabled:
            return {}
        wanted = list(dict.fromkeys(keys))
        found = {k: self.pending[k] for k in wanted if k in self.pending}
        rest = [k for k in wanted if k not in found]
        try:
            with session_scope(self.engine) as session:
                for i in range(0, len(rest), LOOKUP_CHUNK):
                    chunk = rest[i : i + LOOKUP_CHUNK]
                    rows = session.exec(
                        select(col(ScoreCacheRow.key), col(ScoreCacheRow.score)).where(
                            col(ScoreCacheRow.key).in_(chunk)
                        )
                    ).all()
                    found.update({k: float(s) for k, s in rows})
        except Exception as exc:  # noqa: BLE001 - the cache saves work, it never stops a run
            self._off("a lookup", exc)
            return {}
        self.hits += sum(k in found for k in keys)
        self.misses += sum(k not in found for k in keys)
        return found

    def add(self, scores: dict[str, float]) -> None:
        if self.enabled:
            self.pending.update(scores)

    def flush(self) -> None:
        """Insert the pending scores (insert-or-nothing on the key), one transaction."""
        if not self.enabled or not self.pending:
            return
        from srd_worker.store.crud import _dialect_insert

        now = utcnow()
        rows = [
            {"key": k, "reward": self.reward, "score": s, "created_at": now} for k, s in self.pending.items()
        ]
        try:
            with session_scope(self.engine) as session:
                stmt = _dialect_insert(session, ScoreCacheRow).on_conflict_do_nothing(index_elements=["key"])
                for i in range(0, len(rows), LOOKUP_CHUNK):
                    session.exec(stmt, params=rows[i : i + LOOKUP_CHUNK])
        except Exception as exc:  # noqa: BLE001 - the cache saves work, it never stops a run
            self._off("writing scores", exc)
            return
        self.written += len(rows)
        self.pending.clear()
