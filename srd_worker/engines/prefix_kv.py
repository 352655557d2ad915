"""Content-addressed prefix KV store of the transformers engine (``SRDQ_KV_REUSE``).

When a request's generation ends (finished or out of budget) the engine snapshots that row's per-layer
keys and values for the tokens it fed (``prompt_ids + generated[:-1]``; the last sampled token was never
fed) and stores them here, keyed by that token sequence. A later request looks up the stored sequence
with the longest common prefix with its ``prompt_ids`` and feeds only what follows: a round of SRD,
rejection sampling, Speculative Rejection or chunked Best-of-N asks for ``prompt + kept tokens``, an
exact extension of what the previous round fed (one token to feed); an SRD edit asks for
``prompt + τ[:j*]``, a prefix of a stored sequence (its cache is cropped to ``j*``).

Lookup cost does not grow with the number of stored sequences: every entry is indexed by a chained hash
of its first k tokens for k = 16, 32, 48, ... (``BLOCK``; each block's hash folds in the one before, so
hashing a sequence is linear in its length); a lookup walks the request's blocks while some entry shares
them and compares token by token only with the entries sharing the longest such block prefix. Reuse below one block
(16 tokens) is not attempted. An entry whose sequence is a prefix of a newly stored one (the round before)
is dropped, since the new one serves every lookup it could; the rest are evicted least recently used
first, under a byte budget (``SRDQ_KV_REUSE_MB``), on the model's device.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

BLOCK = 16


@dataclass
class KVEntry:
    id: int
    tokens: tuple[int, ...]
    array: Any  # numpy int64 copy of tokens, for fast comparisons
    kv: list[tuple[Any, Any]]  # per layer: (keys, values), each (kv_heads, len(tokens), head_dim)
    nbytes: int
    #: teacher-forced logprobs of tokens lp_from … len(tokens) − 1 (a scored sequence; empty: none known)
    lp_from: int = 0
    lps: list[float] = field(default_factory=list)

    def knows(self, first: int, last: int) -> bool:
        """True if the logprobs of tokens ``first`` … ``last`` are known (an empty span always is)."""
        return last < first or (
            bool(self.lps) and self.lp_from <= first and last < self.lp_from + len(self.lps)
        )

    def known_logprobs(self, first: int, last: int) -> list[float]:
        """The logprobs of tokens ``first`` … ``last`` (``knows`` must hold)."""
        if not self.knows(first, last):
            raise KeyError(f"logprobs of tokens {first}…{last} are not known")
        return self.lps[first - self.lp_from : last + 1 - self.lp_from]


def _block_keys(tokens: tuple[int, ...]):
    """(k, chained hash of tokens[:k]) for k = BLOCK, 2·BLOCK, ... <= len(tokens), lazily."""
    h = 0
    for k in range(BLOCK, len(tokens) + 1, BLOCK):
        h = hash((h, tokens[k - BLOCK : k]))
        yield (k, h)


class PrefixKVStore:
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = int(budget_bytes)
        self.entries: OrderedDict[int, KVEntry] = OrderedDict()  # least recently used first
        self._index: dict[tuple[int, int], set[int]] = {}
        self._exact: dict[tuple[int, ...], int] = {}
        self.nbytes = 0
        self.evictions = 0
        self._next_id = 0

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, prompt_ids: tuple[int, ...] | list[int]) -> tuple[KVEntry | None, int]:
        """The stored entry sharing the longest prefix with ``prompt_ids`` and that length (at least
        ``BLOCK``), or (None, 0). Ties go to the newest entry. Marks the entry as recently used."""
        p = tuple(prompt_ids)
        found = None
        for key in _block_keys(p):  # sharing k·BLOCK tokens implies sharing every shorter block prefix
            if key not in self._index:
                break
            found = key
        if found is None:
            return None, 0
        arr = np.asarray(p, dtype=np.int64)
        best, best_common = None, 0
        for eid in sorted(self._index[found], reverse=True):  # newest first
            e = self.entries[eid]
            n = min(len(e.tokens), len(p))
            diff = np.flatnonzero(e.array[:n] != arr[:n])
            common = int(diff[0]) if diff.size else n
            if common > best_common:
                best, best_common = e, common
        if best is None or best_common < BLOCK:
            return None, 0
        self.entries.move_to_end(best.id)
        return best, best_common

    def put(
        self,
        tokens: tuple[int, ...],
        kv: list[tuple[Any, Any]],
        *,
        supersedes: KVEntry | None,
        logprobs: tuple[int, list[float]] | None = None,
    ) -> None:
        """Store ``kv`` (already cloned) for ``tokens``, with ``logprobs`` (first token, logprobs of it
        and the tokens after it) where known; drop ``supersedes`` when it is a prefix of them."""
        if len(tokens) < BLOCK:
            return
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if nbytes > self.budget_bytes:
            return
        old = self._exact.get(tokens)
        if old is not None:
            if logprobs is None and self.entries[old].lps:  # the same tokens again: keep what was scored
                logprobs = (self.entries[old].lp_from, self.entries[old].lps)
            self._remove(old)
        if (
            supersedes is not None
            and supersedes.id in self.entries
            and len(supersedes.tokens) <= len(tokens)
            and tokens[: len(supersedes.tokens)] == supersedes.tokens
        ):
            self._remove(supersedes.id)
        eid = self._next_id
        self._next_id += 1
        entry = KVEntry(eid, tokens, np.asarray(tokens, dtype=np.int64), kv, nbytes)
        if logprobs is not None and logprobs[1]:
            entry.lp_from, entry.lps = int(logprobs[0]), [float(x) for x in logprobs[1]]
        self.entries[eid] = entry
        self._exact[tokens] = eid
        for key in _block_keys(tokens):
            self._index.setdefault(key, set()).add(eid)
        self.nbytes += nbytes
        while self.nbytes > self.budget_bytes and self.entries:
            self._remove(next(iter(self.entries)))
            self.evictions += 1

    def _remove(self, eid: int) -> None:
        entry = self.entries.pop(eid)
        self.nbytes -= entry.nbytes
        if self._exact.get(entry.tokens) == eid:
            del self._exact[entry.tokens]
        for key in _block_keys(entry.tokens):
            ids = self._index.get(key)
            if ids is not None:
                ids.discard(eid)
                if not ids:
                    del self._index[key]

    def clear(self) -> None:
        self.entries.clear()
        self._index.clear()
        self._exact.clear()
        self.nbytes = 0
