"""Teacher-forced logprobs remembered by token prefix, so a scorer can read an engine's prefix cache.

vLLM computes ``prompt_logprobs`` only for the positions it does not find in its prefix cache: a
sequence whose first k tokens hit cached KV blocks (``RequestOutput.num_cached_tokens``) gets real
logprobs for tokens k+1 … n−1 only (the logits at position j predict token j+1); vLLM 0.32 still returns
n entries, those of tokens 1 … k holding no data. vLLM therefore skips the cache for such requests by
default, and a reward that re-scores a growing response (SRD scores every Δ tokens) pays a full prefill
of prompt + response each time.

``PrefixLogprobs`` keeps the logprobs of the sequences already scored, indexed at the cache's block
boundaries: after scoring a sequence s, for every block multiple b with b < len(s) the logprobs of tokens
1 … b of s are known. When a new sequence hits k cached tokens (k is a block multiple), its tokens 1 … k
are read from any remembered sequence sharing its first k + 1 tokens; a miss (the cache was filled by a
request this memo never saw, e.g. a generation, or the memo evicted it) is reported, and the caller
re-runs that sequence without the cache. Bounded: the least recently used sequences are dropped.

``scoring_plan`` works within one call: a sequence that another one of the call starts with (the
prefixes of one response that SRD's FINDBOUNDARY scores together) needs no pass of its own, since its
logprobs are the first entries of the longer one's; the vLLM and openai engines send the longest only.

Pure Python: the vLLM engine uses it (``VLLMEngine.logprobs``) and the unit tests drive it directly.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence


class PrefixLogprobs:
    """Remembered per-token logprobs of scored sequences, looked up by a shared block-aligned prefix."""

    def __init__(self, block_size: int, capacity: int = 4096) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.block_size = int(block_size)
        self.capacity = int(capacity)
        # sequence id -> (tokens, logprobs of tokens 1 … n-1 at indices 1 … n-1; index 0 unused)
        self._seqs: OrderedDict[int, tuple[tuple[int, ...], list[float]]] = OrderedDict()
        # (hash of the first b + 1 tokens, b) -> sequence ids that hold tokens 1 … b
        self._index: dict[tuple[int, int], list[int]] = {}
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._seqs)

    def _keys(self, tokens: tuple[int, ...]) -> list[tuple[int, int]]:
        bs = self.block_size
        return [(hash(tokens[: b + 1]), b) for b in range(bs, len(tokens), bs)]

    def remember(self, tokens: Sequence[int], logprobs: Sequence[float]) -> None:
        """Keep ``logprobs`` (one per token, the first unused) of the scored sequence ``tokens``."""
        seq = tuple(int(t) for t in tokens)
        if len(logprobs) != len(seq):
            raise ValueError(f"{len(logprobs)} logprobs for {len(seq)} tokens")
        keys = self._keys(seq)
        if not keys:
            return  # shorter than a block and one token: no cache hit can ever need it
        sid = self._next_id
        self._next_id += 1
        self._seqs[sid] = (seq, [float(x) for x in logprobs])
        for key in keys:
            self._index.setdefault(key, []).append(sid)
        while len(self._seqs) > self.capacity:
            old, (old_seq, _) = self._seqs.popitem(last=False)
            for key in self._keys(old_seq):
                ids = self._index.get(key)
                if ids is not None:
                    ids[:] = [i for i in ids if i != old]
                    if not ids:
                        del self._index[key]

    def lookup(self, tokens: Sequence[int], k: int) -> list[float] | None:
        """The logprobs of tokens 1 … ``k`` of ``tokens`` (index 0 unused), or None if no remembered
        sequence shares its first ``k`` + 1 tokens."""
        if k <= 0:
            return [0.0]
        if k >= len(tokens):
            return None
        head = tuple(int(t) for t in tokens[: k + 1])
        for sid in reversed(self._index.get((hash(head), k), ())):
            stored, lps = self._seqs[sid]
            if stored[: k + 1] == head:
                self._seqs.move_to_end(sid)
                return lps[: k + 1]
        return None


def prefix_roots(seqs: Sequence[Sequence[int]]) -> list[int]:
    """For each sequence, the index of a sequence of ``seqs`` that starts with it and is a prefix of no
    other (itself when none is longer): teacher-forced logprobs of a sequence are the first entries of those
    of any sequence it begins, so a batch needs a pass over its roots only (SRD's boundary search scores
    many prefixes of one response). Equal sequences share one root.

    In lexicographic order, a sequence's extensions directly follow it, so each sequence takes the root of
    its successor when that successor starts with it: O(n log n) comparisons."""
    tuples = [tuple(int(t) for t in s) for s in seqs]
    root = list(range(len(tuples)))
    after: int | None = None  # the next sequence in lexicographic order, its root already set
    for i in sorted(range(len(tuples)), key=tuples.__getitem__, reverse=True):
        s = tuples[i]
        if after is not None and tuples[after][: len(s)] == s:
            root[i] = root[after]
        after = i
    return root


def scoring_plan(
    seqs: Mapping[int, Sequence[int]], starts: Mapping[int, int]
) -> tuple[dict[int, int], dict[int, int]]:
    """The passes a batch of teacher-forced scorings needs: ``seqs`` are prefix + continuation by pair index,
    ``starts`` each pair's first continuation token. Returns each pair's root (``prefix_roots``; the pair
    whose pass it reads) and, per root, the first token any pair it covers reads: a pass over the root from
    there serves them all, pair i reading tokens ``starts[i]`` … ``len(seqs[i])`` − 1 of it."""
    keys = list(seqs)
    root = {i: keys[r] for i, r in zip(keys, prefix_roots([seqs[i] for i in keys]), strict=True)}
    first: dict[int, int] = {}
    for i in keys:
        first[root[i]] = min(first.get(root[i], starts[i]), starts[i])
    return root, first
