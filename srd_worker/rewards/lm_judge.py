"""An LM-as-judge reward: the policy model's own probability that a partial solution is correct so far.

Follows ALGORITHMS.md §0.2 in shape (one scalar per ``(question, partial response)``, the question as the
user turn, rewards on partial responses first-class) with a generative judge in place of a
sequence-classification head: the question and the partial response go into one user message that asks
whether the solution is correct so far, to be answered Yes or No; the engine's chat template is applied
with the generation prompt, and the reward is

    p = P(Yes) / (P(Yes) + P(No))

read from teacher-forced log-probabilities of the answer's first token (``engine.logprobs``), i.e. the
judge's belief renormalised over the two allowed answers (any mass on other tokens is ignored).

Answer tokens. A tokenizer may spell the reply with or without a leading space ("Yes" / " Yes") depending
on how the template ends, and the two spellings are different tokens, so both are counted: P(Yes) is
the logsumexp of the log-probabilities of the first tokens of "Yes" and " Yes", likewise for No. The
"first token" is the first token at which the Yes and No spellings differ, so a token both share (a BOS
some tokenizers add, a lone space token of a byte-level tokenizer) is skipped rather than counted for
both sides; duplicate ids are counted once. An empty response is allowed: the message then says that
no steps are written yet, and the judge rates the question alone.

Modes and models. ``lm_judge`` is the policy judging itself; ``judge:MODEL`` is another model (its own
engine, ``Settings.judge_engine``: in this process, or an OpenAI-compatible server so a fleet can give
the judge its own machine) asked the same question; ``judge-step:MODEL`` asks whether the *newest step*
is correct given the steps before it (steps split at a blank line, ``split_last_step``), a process
reward for beam search and DVTS, which score every step and aggregate the step scores.

What it leaves out: a trained verifier or PRM head, few-shot judge prompts, scoring
more than the first answer token (each candidate token is one engine pair sharing the same prefix: the
transformers engine computes such pairs as one row; the vLLM engine and the openai engine read them from
one request's top 20 logprobs of the prompt's next token, scoring an answer outside those alone),
truncation of over-long inputs (they raise RewardError).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from srd_worker.engines.base import CAP_GRADIENTS, Engine, policy_gradients
from srd_worker.errors import RewardError
from srd_worker.rewards.base import scoring_engine
from srd_worker.rewards.hf_common import SOFT_MARK

#: The two answers and the spellings counted for each (see the module docstring).
YES_VARIANTS = ("Yes", " Yes")
NO_VARIANTS = ("No", " No")

_EMPTY_RESPONSE = "(no steps written yet)"


#: What the judge is asked: ``prefix`` whether the partial solution is correct so far (an outcome-style
#: score of any prefix); ``step`` whether its last step is correct given the steps before it (a process
#: reward: beam search and DVTS score each step with it and aggregate the step scores).
JUDGE_MODES = ("prefix", "step")


def split_last_step(response: str, delimiter: str = "\n\n") -> tuple[str, str]:
    """(the steps before the last one, the last step) of ``response``, steps separated by ``delimiter``
    (a trailing delimiter ends the last step; it does not start an empty one)."""
    body = response.rstrip()
    head, sep, last = body.rpartition(delimiter)
    return (head if sep else ""), last


def judge_messages(
    question: str, response: str, *, mode: str = "prefix", delimiter: str = "\n\n"
) -> list[dict[str, str]]:
    """The chat messages that ask whether ``response`` answers ``question`` correctly so far (``prefix``)
    or whether its last step is correct (``step``)."""
    if mode == "step":
        before, last = split_last_step(response, delimiter)
        content = (
            "Below is a question, the steps of a solution so far, and its newest step.\n\n"
            f"Question:\n{question.strip()}\n\n"
            f"Steps so far:\n{before.strip() or _EMPTY_RESPONSE}\n\n"
            f"Newest step:\n{last.strip() or _EMPTY_RESPONSE}\n\n"
            "Is the newest step correct? Answer with one word: Yes or No."
        )
        return [{"role": "user", "content": content}]
    solution = response.strip() or _EMPTY_RESPONSE
    content = (
        "Below is a question and a partial solution, which may stop in the middle of a step.\n\n"
        f"Question:\n{question.strip()}\n\n"
        f"Partial solution:\n{solution}\n\n"
        "Is the partial solution correct so far? Answer with one word: Yes or No."
    )
    return [{"role": "user", "content": content}]


def answer_token_ids(
    tokenizer, yes: Sequence[str] = YES_VARIANTS, no: Sequence[str] = NO_VARIANTS
) -> tuple[list[int], list[int]]:
    """Distinct first tokens of the Yes spellings and of the No spellings (paired in order), each token
    taken where the two spellings of a pair first differ. Raises RewardError when a token would count
    for both answers or a spelling encodes to nothing distinctive."""
    yes_ids: list[int] = []
    no_ids: list[int] = []
    for y, n in zip(yes, no, strict=True):
        a, b = list(tokenizer.encode(y)), list(tokenizer.encode(n))
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        if k >= len(a) or k >= len(b):
            raise RewardError(f"the tokenizer does not tell {y!r} from {n!r}: {a} vs {b}")
        if a[k] not in yes_ids:
            yes_ids.append(a[k])
        if b[k] not in no_ids:
            no_ids.append(b[k])
    if set(yes_ids) & set(no_ids):
        raise RewardError(f"answer tokens overlap: yes {yes_ids}, no {no_ids}")
    return yes_ids, no_ids


def _logsumexp(xs: Sequence[float]) -> float:
    m = max(xs)
    if m == -math.inf:
        return -math.inf
    return m + math.log(sum(math.exp(x - m) for x in xs))


def yes_probability(yes_logprobs: Sequence[float], no_logprobs: Sequence[float]) -> float:
    """P(Yes) / (P(Yes) + P(No)) from the log-probabilities of each answer's tokens; 0.5 when both
    answers have probability zero."""
    ly, ln = _logsumexp(yes_logprobs), _logsumexp(no_logprobs)
    if ly == ln:  # covers both -inf
        return 0.5
    d = ly - ln
    # A numerically stable sigmoid(d).
    if d >= 0:
        return 1.0 / (1.0 + math.exp(-d))
    e = math.exp(d)
    return e / (1.0 + e)


class LMJudgeReward:
    """P(Yes) / (P(Yes) + P(No)) of ``engine``'s model judging each partial solution (module docstring).

    ``batch_size`` is the number of engine pairs (prefix, one answer token) per ``engine.logprobs`` call;
    each item takes one pair per distinct answer token (2 to 4).
    """

    name = "lm_judge"

    def __init__(
        self,
        engine: Engine,
        *,
        batch_size: int = 16,
        mode: str = "prefix",
        name: str | None = None,
        separate: bool = False,
    ) -> None:
        if mode not in JUDGE_MODES:
            raise RewardError(f"judge mode must be one of {', '.join(JUDGE_MODES)}, got {mode!r}")
        self.mode = mode
        #: A judge with a model of its own (``judge:MODEL``): no soft score (its vocabulary is not checked
        #: against the policy's), its engine closed with the reward.
        self.separate = separate
        if name is not None:
            self.name = name
        self.engine = scoring_engine(engine, "lm_judge", batch_size)
        self.batch_size = batch_size
        self.yes_ids, self.no_ids = answer_token_ids(engine.tokenizer)
        self.soft_forward_passes = 0

    def prompt_ids(self, question: str, response: str) -> list[int]:
        return list(
            self.engine.tokenizer.chat_prompt_ids(
                judge_messages(question, response, mode=self.mode), add_generation_prompt=True
            )
        )

    def close(self) -> None:
        """Close the judge's own engine (``judge:MODEL``); the run's engine is the run's to close."""
        close = getattr(self.engine, "close", None)
        if self.separate and callable(close):
            close()

    # ------------------------------------------------------------------ differentiable score
    @property
    def can_differentiate(self) -> bool:
        """The soft score needs the engine's gradients (``CAP_GRADIENTS``) and the policy as the judge."""
        return CAP_GRADIENTS in self.engine.capabilities and not self.separate

    def vocab_overlap(self, policy_vocab: Sequence[str | None]) -> float:
        """The judge is the policy itself: its vocabulary is the policy's."""
        return 1.0 if len(policy_vocab) == policy_gradients(self.engine).vocab_size else 0.0

    def soft_score(self, question: str, prefix: str, soft: Any, policy_vocab: Sequence[str | None]) -> Any:
        """P(Yes) / (P(Yes) + P(No)) with the soft tokens placed after ``prefix`` in the judge prompt,
        differentiable w.r.t. ``soft`` through the engine's ``PolicyGradients`` (rewards/base.py
        ``DifferentiableReward``). The prompt is built with a mark where the soft tokens go; the mark's
        token ids are located in the templated prompt and replaced by the soft rows."""
        import torch

        grads = policy_gradients(self.engine)
        tok = self.engine.tokenizer
        ids = self.prompt_ids(question, prefix + SOFT_MARK)
        mark = list(tok.encode(SOFT_MARK))
        at = next((k for k in range(len(ids) - len(mark) + 1) if ids[k : k + len(mark)] == mark), None)
        if at is None or not mark:
            raise RewardError("cannot place the soft tokens in the judge prompt (the mark was re-tokenised)")
        logits = grads.soft_logits([ids[:at], soft, ids[at + len(mark) :]])[-1]
        logp = torch.log_softmax(logits, dim=-1)
        dev = logp.device
        ly = torch.logsumexp(logp[torch.tensor(self.yes_ids, device=dev)], 0)
        ln = torch.logsumexp(logp[torch.tensor(self.no_ids, device=dev)], 0)
        self.soft_forward_passes += 1
        return torch.sigmoid(ly - ln)

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
        if len(prompts) != len(responses):
            raise RewardError(f"got {len(prompts)} prompts but {len(responses)} responses")
        candidates = self.yes_ids + self.no_ids
        pairs: list[tuple[list[int], list[int]]] = []
        for i, (q, r) in enumerate(zip(prompts, responses, strict=True)):
            prefix = self.prompt_ids(q, r)
            if len(prefix) + 1 > self.engine.max_context:
                raise RewardError(
                    f"item {i}: the judge prompt has {len(prefix)} tokens, more than the "
                    f"engine's context of {self.engine.max_context}"
                )
            pairs.extend((prefix, [t]) for t in candidates)
        logps: list[float] = []
        for start in range(0, len(pairs), self.batch_size):
            chunk = pairs[start : start + self.batch_size]
            out = self.engine.logprobs(chunk)
            if len(out) != len(chunk) or any(len(o) != 1 for o in out):
                raise RewardError(
                    f"engine returned {[len(o) for o in out]} logprobs for {len(chunk)} "
                    "one-token continuations"
                )
            logps.extend(o[0] for o in out)
        n_yes, per_item = len(self.yes_ids), len(candidates)
        scores = []
        for i in range(len(prompts)):
            row = logps[i * per_item : (i + 1) * per_item]
            scores.append(yes_probability(row[:n_yes], row[n_yes:]))
        return scores
