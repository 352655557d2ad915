"""∇-Reasoner: decoding by test-time gradient descent on token logits (DTO; ALGORITHMS.md §9).

One response per problem, built token by token around a full rollout ("ahead" tokens). Each loop
iteration (one runner round per item):

1. the rollout's per-position logits ``Z`` come from one teacher-forced policy forward;
2. token selection: the first ahead position that is not confident (max softmax(Z_t) <= threshold),
   whose gradient norm ‖∂L/∂Y_t‖ from one full policy + reward forward/backward probe is large enough
   (and, optionally, whose entropy is high enough); the tokens before it are committed; when no position
   qualifies the whole rollout is committed and the item is done;
3. DTO on the first remaining position: straight-through one-hot ``Y`` over ``Z``, soft embeddings into
   the policy and the reward model, loss ``-(c_nll·loglik + c_r·reward)``, Adam with a cosine schedule,
   gradient caching (a linear surrogate ⟨g, Y⟩ until the argmax changes), only position 0 updated;
4. a token t̃ is sampled from the optimised logits; if it equals the rollout's token, that token is
   committed; otherwise a new rollout continues from t̃ and replaces the current one if its reward is
   higher (both sides scored response-only under the same template, ``reward.score``), else the old
   token is committed ("rollout reuse");
5. stop at EOS or ``max_new_tokens``; when the rollout budget (``max_generations``, the first rollout
   included) is spent, the rest of the current rollout is committed.

The method talks to the engine through ``PolicyGradients`` (``engines/base.py``, CAP_GRADIENTS) and to
the reward through ``DifferentiableReward`` (``rewards/base.py``); rule-based rewards are refused.

Checkpoints: the state holds the committed and ahead tokens, the current rollout's reward and the
counters. ``Z`` is recomputed from the token ids (a teacher-forced forward over the same sequence gives
the same logits), and the optimiser never outlives one round (a DTO runs within one iteration), so a
resumed run computes exactly what an uninterrupted one does. An in-memory cache keeps ``Z`` of each
item's current sequence between rounds; the counters count logical passes, cache or not.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any, TypedDict, cast

from srd_worker.engines.base import CAP_GRADIENTS, CAP_SAMPLING, SamplingParams, policy_gradients
from srd_worker.errors import CapabilityError, ConfigError
from srd_worker.methods.base import (
    GenCall,
    ItemState,
    Method,
    MethodParams,
    ScoreCall,
    StepContext,
    _require,
    new_state,
    param,
)
from srd_worker.rewards.base import DifferentiableReward, differentiable


@dataclasses.dataclass(frozen=True)
class NablaReasonerParams(MethodParams):
    max_new_tokens: int = param(
        500, "maximum response tokens (reference scripts: 1024 MATH-500/AMC, 3072 AIME)"
    )
    temperature: float = param(0.6, "rollout temperature (reference MATH-500 script: 0.6)")
    top_p: float = param(0.95, "rollout nucleus (top-p) mass")
    top_k: int = param(
        0, "rollout top-k (0 = off; the reference falls back to the model's generation_config)"
    )
    resample_temperature: float = param(
        0.5, "temperature of the token sampled from the optimised logits (0 = argmax)"
    )
    resample_top_p: float = param(0.95, "top-p of the token sampled from the optimised logits")
    resample_top_k: int = param(0, "top-k of the token sampled from the optimised logits (0 = off)")
    max_generations: int = param(8, "rollout budget per problem, the first rollout included (n_generations)")
    rejection_sampling: bool = param(
        True, "keep a revised rollout only if its reward beats the current one (false: always accept)"
    )
    reward_coeff: float = param(1.0, "c_r: weight of the reward in the DTO loss (0 = likelihood only)")
    nll_coeff: float = param(0.001, "c_nll: weight of the log-likelihood in the DTO loss")
    max_iters: int = param(20, "DTO optimiser iterations per selected token")
    lr: float = param(0.01, "Adam learning rate of the DTO (weight decay 0, no warm-up)")
    min_lr_ratio: float = param(0.1, "the cosine schedule's floor, min_lr_ratio * lr")
    lr_schedule: str = param(
        "clip",
        "clip: lr * max(min_lr_ratio, cosine), the reference code's schedule; rescale: lr * (min_lr_ratio + "
        "(1 - min_lr_ratio) * cosine), transformers' cosine-with-min-lr (srdq before 2026-12-07)",
    )
    grad_caching: bool = param(
        True, "reuse the last full gradient as a linear surrogate until the argmax token changes"
    )
    confidence_threshold: float | None = param(
        0.97, "select a position only if its max softmax(Z_t) <= this (none = criterion off)"
    )
    grad_norm_threshold: float | None = param(
        4.0, "select a position only if ‖∂L/∂Y_t‖ >= this, from one full probe per iteration (none = off)"
    )
    entropy_threshold: float | None = param(
        None, "select a position only if the entropy of softmax(Z_t) >= this (none = criterion off)"
    )
    straight_through: bool = param(
        True, "hard one-hot forward with softmax gradients (false: the soft relaxation softmax(Z/τ) itself)"
    )
    st_temperature: float = param(1.0, "τ of the straight-through softmax")
    embedder: str = param(
        "logits",
        "what the DTO optimises: logits (Z, the reference default) or latents (the final hidden states H, "
        "Z = W_out·H; the reference's AMC script)",
    )
    min_vocab_overlap: float = param(
        0.9,
        "[PROPOSED] refuse a reward model whose tokenizer has a counterpart for less than this fraction "
        "of the policy's tokens (token-string alignment; 1.0 when they share a tokenizer)",
    )

    def validate(self) -> None:
        _require(self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        for name in ("temperature", "resample_temperature"):
            _require(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("top_p", "resample_top_p"):
            _require(0 < getattr(self, name) <= 1, f"{name} must be in (0, 1], got {getattr(self, name)}")
        _require(self.max_generations >= 1, f"max_generations must be >= 1, got {self.max_generations}")
        _require(self.max_iters >= 1, f"max_iters must be >= 1, got {self.max_iters}")
        _require(self.lr > 0, f"lr must be > 0, got {self.lr}")
        _require(0 <= self.min_lr_ratio <= 1, f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _require(
            self.lr_schedule in LR_SCHEDULES,
            f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}",
        )
        _require(self.st_temperature > 0, f"st_temperature must be > 0, got {self.st_temperature}")
        _require(self.nll_coeff >= 0, f"nll_coeff must be >= 0, got {self.nll_coeff}")
        _require(
            self.embedder in ("logits", "latents"),
            f"embedder must be logits or latents, got {self.embedder!r}",
        )
        _require(
            0 <= self.min_vocab_overlap <= 1,
            f"min_vocab_overlap must be in [0, 1], got {self.min_vocab_overlap}",
        )


#: The §9.5 counters (ALGORITHMS.md; the spec's §8.6), all in the result's extras. Pass counts are logical (a teacher-
#: forced prefill served from the in-memory cache still counts), so a resumed run reports the same.
COUNTERS = (
    "num_llm_calls",  # reference definition: rollout tokens + 4 per full DTO step + 2 per acceptance check
    "n_generations",  # rollouts, the first one included
    "n_rejections",  # revised rollouts rejected by the reward comparison
    "n_generated_tokens",  # tokens sampled in rollouts
    "n_optimized_tokens",  # reference: ahead length x full DTO steps, summed over DTO calls
    "n_rewarded_tokens",  # response tokens of both sides of every acceptance check
    "num_grad_steps",  # full DTO forward/backward steps (cached steps not counted)
    "n_cached_steps",  # DTO steps served by the cached gradient (no model pass)
    "n_dto_calls",  # selected positions optimised
    "n_revisions",  # sampled token differed from the rollout's (a proposal was made)
    "n_acceptance_checks",  # reward comparisons of proposal vs current rollout
    "n_iterations",  # loop iterations
    "n_prefill_forwards",  # teacher-forced policy forwards giving each rollout's Z (not in num_llm_calls)
    "n_probe_passes",  # grad-norm selection probes, each a full LM+RM forward/backward (not in num_llm_calls)
    "lm_forward_passes",  # policy forwards: prefills + probes + full DTO steps (+ rollout tokens are apart)
    "lm_backward_passes",
    "rm_forward_passes",  # reward-model forwards: soft scores + reward.score calls
    "rm_backward_passes",
)


class NablaState(ItemState):
    past: list[int]  # committed response tokens
    ahead: list[int]  # the current rollout's uncommitted tokens
    ahead_finish: str | None  # how the current rollout ended: eos | stop | length
    reward: float | None  # R(question, past + ahead) of the current rollout, once scored
    started: bool  # the first rollout has been drawn
    finish: str | None
    text: str  # decode(past), set when the item is done
    stats: dict[str, int]


class _Plan(TypedDict, total=False):
    state: NablaState
    token: int  # the resampled token t̃ (a proposal)
    call: GenCall | None
    budget: int


LR_SCHEDULES = ("clip", "rescale")


def _new_stats() -> dict[str, int]:
    return {k: 0 for k in COUNTERS}


def cosine_factor(step: int, total: int, min_ratio: float, schedule: str = "clip") -> float:
    """The learning-rate multiplier after ``step`` of ``total`` steps: the half cosine ``c`` from 1 to 0,
    floored at ``min_ratio`` (``clip``: ``max(min_ratio, c)``, the reference code) or squeezed into
    [``min_ratio``, 1] (``rescale``: ``min_ratio + (1 − min_ratio)·c``)."""
    progress = min(step, total) / max(total, 1)
    c = 0.5 * (1 + math.cos(math.pi * progress))
    return max(min_ratio, c) if schedule == "clip" else min_ratio + (1 - min_ratio) * c


def straight_through(z: Any, tau: float, hard: bool) -> Any:
    """``onehot(argmax z) + softmax(z/τ) − stopgrad(softmax(z/τ))`` (``hard``), else ``softmax(z/τ)``."""
    import torch

    soft = torch.softmax(z / tau, dim=-1)
    if not hard:
        return soft
    onehot = torch.zeros_like(soft).scatter_(-1, soft.argmax(-1, keepdim=True), 1.0)
    return (onehot - soft).detach() + soft


@dataclasses.dataclass
class DTOResult:
    logits: Any  # the optimised logits of position 0
    full_steps: int
    cached_steps: int
    losses: list[float]  # the full loss at every full step, in order
    soft_losses: list[float]  # the loss the step minimised: full loss, or the surrogate <g, Y> when cached
    tokens: list[int]  # argmax of position 0 after every iteration


class DTOProblem:
    """The DTO loss of one item at one point of the loop: policy log-likelihood and reward of the soft
    ahead tokens after ``prefix_ids`` (prompt + committed tokens). ALGORITHMS.md §9.1."""

    def __init__(
        self,
        grads: Any,
        reward: Any,
        question: str,
        prefix_ids: Sequence[int],
        past_text: str,
        p: NablaReasonerParams,
        stats: dict[str, int],
    ) -> None:
        self.grads, self.reward, self.question = grads, reward, question
        self.prefix_ids, self.past_text, self.p, self.stats = list(prefix_ids), past_text, p, stats
        self.vocab = grads.vocab_tokens()

    def loss(self, y: Any) -> tuple[Any, Any, Any]:
        """(loss, log-likelihood, reward) of soft tokens ``y`` ``[L, V]``; one LM and (when c_r != 0) one
        RM forward."""
        import torch

        n = len(self.prefix_ids)
        logits = self.grads.soft_logits([self.prefix_ids, y])
        pred = torch.log_softmax(logits[n - 1 : n - 1 + y.shape[0]], dim=-1)
        loglik = (pred * y).sum()
        self.stats["lm_forward_passes"] += 1
        total = self.p.nll_coeff * loglik
        reward = None
        if self.p.reward_coeff != 0:
            reward = self.reward.soft_score(self.question, self.past_text, y, self.vocab)
            self.stats["rm_forward_passes"] += 1
            total = total + self.p.reward_coeff * reward
        return -total, loglik, reward

    def grad_y(self, y: Any) -> tuple[Any, float]:
        """(∂L/∂y, L) by one forward/backward through the policy and the reward model."""
        import torch

        loss, _, _ = self.loss(y)
        (g,) = torch.autograd.grad(loss, y)
        self.stats["lm_backward_passes"] += 1
        if self.p.reward_coeff != 0:
            self.stats["rm_backward_passes"] += 1
        return g.detach().float(), float(loss.detach())

    def probe(self, z: Any) -> Any:
        """‖∂L/∂Y_t‖₂ per ahead position at the rollout's own logits ``z`` (the selection probe)."""
        import torch

        y = straight_through(z, self.p.st_temperature, self.p.straight_through).detach().requires_grad_(True)
        g, _ = self.grad_y(y)
        self.stats["n_probe_passes"] += 1
        return torch.linalg.vector_norm(g, ord=2, dim=-1)

    def to_logits(self, latents: Any) -> Any:
        """Logits from the optimised variables: themselves (``embedder=logits``) or the output head applied
        to final hidden states (``embedder=latents``)."""
        return latents if self.p.embedder == "logits" else self.grads.project(latents)

    def optimise(self, z: Any) -> DTOResult:
        """Adam on position 0 of ``z`` (``[L, V]`` logits, or ``[L, d]`` hidden states with
        ``embedder=latents``), the others fixed, for ``max_iters`` iterations with the cosine schedule and
        gradient caching (ALGORITHMS.md §9.1)."""
        import torch

        p = self.p
        z0 = z[0].detach().clone().float().requires_grad_(True)
        rest = z[1:].detach().float()
        opt = torch.optim.Adam([z0], lr=p.lr, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: cosine_factor(step, p.max_iters, p.min_lr_ratio, p.lr_schedule)
        )
        cached = None
        current = int(self.to_logits(z0.detach().unsqueeze(0))[0].argmax())
        out = DTOResult(None, 0, 0, [], [], [])
        for _ in range(p.max_iters):
            logits = self.to_logits(torch.cat([z0.unsqueeze(0), rest], 0))
            y = straight_through(logits, p.st_temperature, p.straight_through)
            if cached is None:
                g, value = self.grad_y(y)
                out.full_steps += 1
                out.losses.append(value)
                out.soft_losses.append(value)
                if p.grad_caching:
                    cached = g
            else:
                g = cached
                out.cached_steps += 1
                out.soft_losses.append(float((g * y.detach()).sum()))
            (grad_z0,) = torch.autograd.grad((g * y).sum(), z0)
            opt.zero_grad(set_to_none=True)
            z0.grad = grad_z0
            opt.step()
            sched.step()
            token = int(self.to_logits(z0.detach().unsqueeze(0))[0].argmax())
            out.tokens.append(token)
            if token != current:
                current, cached = token, None
        out.logits = self.to_logits(z0.detach().unsqueeze(0))[0].detach()
        return out


def sample_token(logits: Any, temperature: float, top_p: float, top_k: int, seed: int) -> int:
    """One token from ``logits`` (``[V]``) after temperature, top-k then top-p (the reference order), drawn
    with a generator seeded by ``seed``; temperature 0 is the argmax."""
    import torch

    logits = logits.detach().float().cpu()
    if temperature == 0:
        return int(logits.argmax())
    scaled = logits / temperature
    if 0 < top_k < scaled.shape[0]:
        kth = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        order = torch.argsort(scaled, descending=True)
        probs = torch.softmax(scaled[order], dim=-1)
        before = probs.cumsum(-1) - probs
        drop = order[before >= top_p]  # keep the smallest prefix whose mass reaches top_p
        scaled[drop] = float("-inf")
    gen = torch.Generator().manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
    return int(torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=gen))


class NablaReasoner(Method[NablaState, NablaReasonerParams]):
    name = "nabla_reasoner"
    honours_stop = False  # rollouts are decoded token by token, not through StepContext.generate
    Params = NablaReasonerParams
    summary = "∇-Reasoner: test-time gradient descent on token logits (DTO) with reward-checked rollouts"
    needs_reward = True
    needs_differentiable_reward = True
    needs_capabilities = frozenset({CAP_SAMPLING, CAP_GRADIENTS})

    def __init__(self, params: NablaReasonerParams) -> None:
        super().__init__(params)
        self._z_cache: dict[str, tuple[tuple[int, ...], int, Any]] = {}
        self._checked: set[int] = set()

    def init_state(self, item_id: str, question: str, prompt_ids: Sequence[int]) -> NablaState:
        return {
            **new_state(item_id, question, prompt_ids),
            "past": [],
            "ahead": [],
            "ahead_finish": None,
            "reward": None,
            "started": False,
            "finish": None,
            "text": "",
            "stats": _new_stats(),
        }

    # ------------------------------------------------------------------ checks
    def _check(self, ctx: StepContext, grads: Any) -> None:
        reward = ctx.reward
        if reward is None:
            raise ConfigError(f"method '{self.name}' needs a reward model: pass --reward (hf-orm:MODEL, ...)")
        if id(reward) in self._checked:
            return
        if not differentiable(reward):
            raise CapabilityError(
                f"method '{self.name}' needs a differentiable reward (hf-orm:MODEL, hf-prm:MODEL or "
                f"lm_judge); reward '{getattr(reward, 'name', type(reward).__name__)}' gives no gradient"
            )
        # differentiable(reward) checked above: it is a DifferentiableReward
        overlap = cast(DifferentiableReward, reward).vocab_overlap(grads.vocab_tokens())
        if overlap < self.params.min_vocab_overlap:
            raise ConfigError(
                f"reward '{reward.name}': its tokenizer has a counterpart for {overlap:.1%} of the policy's "
                f"tokens, less than min_vocab_overlap={self.params.min_vocab_overlap}; the soft tokens "
                "cannot be carried into the reward model"
            )
        self._checked.add(id(reward))

    # ------------------------------------------------------------------ helpers
    def _z(self, grads: Any, state: NablaState) -> Any:
        """Teacher-forced logits (``embedder=latents``: final hidden states) of the ahead tokens, cached per
        item for the current sequence."""
        prefix = state["prompt_ids"] + state["past"]
        seq = tuple(prefix + state["ahead"])
        hit = self._z_cache.get(state["item_id"])
        if hit is not None and hit[0] == seq and hit[1] <= len(prefix):
            return hit[2][len(prefix) - hit[1] :]
        if self.params.embedder == "latents":
            z = grads.teacher_forced_hidden(prefix, state["ahead"])
        else:
            z = grads.teacher_forced_logits(prefix, state["ahead"])
        self._z_cache[state["item_id"]] = (seq, len(prefix), z)
        return z

    def _rollout_call(
        self, ctx: StepContext, state: NablaState, extra: list[int], component: str
    ) -> tuple[GenCall, int]:
        p = self.params
        budget = p.max_new_tokens - len(state["past"]) - len(extra)
        sp = SamplingParams(
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            max_new_tokens=max(budget, 0),
            seed=ctx.seed(state, 0, "rollout"),
        )
        return GenCall(state, state["prompt_ids"] + state["past"] + extra, sp, component), budget

    def _commit(self, state: NablaState, n: int) -> None:
        state["past"] += state["ahead"][:n]
        state["ahead"] = state["ahead"][n:]

    def _finish(self, state: NablaState, reason: str | None) -> None:
        self._z_cache.pop(state["item_id"], None)
        state["done"] = True
        state["finish"] = reason or "length"

    def _stop_check(self, state: NablaState, eos: frozenset[int]) -> None:
        """Done at EOS, at the length cap, or when the rollout is used up."""
        if state["past"] and state["past"][-1] in eos:
            self._finish(state, "eos")
        elif len(state["past"]) >= self.params.max_new_tokens:
            self._finish(state, "length")
        elif not state["ahead"]:
            self._finish(state, state["ahead_finish"])
        elif state["stats"]["n_generations"] >= self.params.max_generations:
            self._commit(state, len(state["ahead"]))
            self._finish(state, state["ahead_finish"])

    # ------------------------------------------------------------------ one iteration before the rollout
    def _plan(self, ctx: StepContext, grads: Any, state: NablaState) -> _Plan | None:
        """Selection, DTO and resampling for one item; a plan with the resampled token, or None when the
        iteration ended without a proposal (token committed, or the item finished)."""
        import torch

        p, stats = self.params, state["stats"]
        stats["n_iterations"] += 1
        t0 = time.perf_counter()
        latents = self._z(grads, state)
        problem = self._problem(ctx, grads, state)
        with torch.no_grad():
            z = problem.to_logits(latents).float()
        select = torch.ones(z.shape[0], dtype=torch.bool, device=z.device)
        probs = torch.softmax(z, dim=-1)
        if p.entropy_threshold is not None:
            entropy = -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
            select &= entropy >= p.entropy_threshold
        if p.confidence_threshold is not None:
            select &= probs.max(-1).values <= p.confidence_threshold
        if p.grad_norm_threshold is not None and bool(select.any()):
            select &= problem.probe(z).to(select.device) >= p.grad_norm_threshold
        hits = select.nonzero()
        pos = int(hits[0]) if hits.numel() else len(state["ahead"])
        state["timing"]["router"] += time.perf_counter() - t0
        self._commit(state, pos)
        if not state["ahead"]:
            self._finish(state, state["ahead_finish"])
            return None
        t1 = time.perf_counter()
        problem = self._problem(ctx, grads, state)
        res = problem.optimise(latents[pos:])
        stats["n_dto_calls"] += 1
        stats["num_grad_steps"] += res.full_steps
        stats["n_cached_steps"] += res.cached_steps
        stats["num_llm_calls"] += 4 * res.full_steps
        stats["n_optimized_tokens"] += len(state["ahead"]) * res.full_steps
        token = sample_token(
            res.logits,
            p.resample_temperature,
            p.resample_top_p,
            p.resample_top_k,
            ctx.seed(state, 0, "resample"),
        )
        state["timing"]["editor"] += time.perf_counter() - t1
        if token == state["ahead"][0]:
            self._commit(state, 1)
            self._stop_check(state, ctx.engine.tokenizer.eos_token_ids)
            return None
        stats["n_revisions"] += 1
        if token in ctx.engine.tokenizer.eos_token_ids:
            return {"state": state, "token": token, "call": None, "budget": 0}
        call, budget = self._rollout_call(ctx, state, [token], "editor")
        return {"state": state, "token": token, "call": call if budget > 0 else None, "budget": budget}

    def _problem(self, ctx: StepContext, grads: Any, state: NablaState) -> DTOProblem:
        return DTOProblem(
            grads,
            ctx.reward,
            state["question"],
            state["prompt_ids"] + state["past"],
            ctx.decode(state["past"]),
            self.params,
            state["stats"],
        )

    # ------------------------------------------------------------------ the round
    def step(self, states: list[NablaState], ctx: StepContext) -> list[NablaState]:
        grads = policy_gradients(ctx.engine)
        self._check(ctx, grads)
        eos = ctx.engine.tokenizer.eos_token_ids
        starts: list[tuple[NablaState, GenCall, int]] = []
        plans: list[_Plan] = []
        for state in states:
            if state["done"]:
                continue
            if not state["started"]:
                call, budget = self._rollout_call(ctx, state, [], "drafter")
                starts.append((state, call, budget))
                continue
            plan = self._plan(ctx, grads, state)
            if plan is not None:
                plans.append(plan)
        # ONE engine batch: first rollouts and revised rollouts
        calls = [c for _, c, _ in starts] + [pl["call"] for pl in plans if pl["call"] is not None]
        gens = iter(ctx.generate(calls))
        for state, _, _ in starts:
            gen = next(gens)
            self._count_rollout(state, gen.token_ids)
            state["started"] = True
            state["ahead"] = list(gen.token_ids)
            state["ahead_finish"] = gen.finish_reason
            if not state["ahead"]:
                self._finish(state, gen.finish_reason)
        proposals: list[tuple[_Plan, list[int], str]] = []
        for pl in plans:
            if pl["call"] is not None:
                gen = next(gens)
                self._count_rollout(pl["state"], gen.token_ids)
                proposals.append((pl, list(gen.token_ids), gen.finish_reason))
            elif pl["token"] in eos:
                proposals.append((pl, [], "eos"))
            else:  # no room left after the token
                proposals.append((pl, [], "length"))
        self._decide(ctx, proposals, eos)
        # the reward of every finished response (the current rollout's, when not scored yet)
        ended = [s for s in states if s["done"] and s.get("started") and s["reward"] is None]
        self._score_current(ctx, ended)
        for state in states:
            if state["done"]:
                state["text"] = ctx.decode(state["past"])
            state["round"] += 1
        return states

    def _count_rollout(self, state: NablaState, tokens: Sequence[int]) -> None:
        stats = state["stats"]
        stats["n_generations"] += 1
        stats["n_generated_tokens"] += len(tokens)
        stats["num_llm_calls"] += len(tokens)
        stats["n_prefill_forwards"] += 1
        stats["lm_forward_passes"] += 1

    def _score_current(self, ctx: StepContext, states: Sequence[NablaState]) -> None:
        calls = [
            ScoreCall(
                s,
                ctx.decode(s["past"] + s["ahead"]),
                len(s["past"]) + len(s["ahead"]),
                finished=self._ended(s["ahead_finish"]),
            )
            for s in states
        ]
        for s, r in zip(states, ctx.score(calls), strict=True):
            s["reward"] = r
            s["stats"]["rm_forward_passes"] += 1

    @staticmethod
    def _ended(finish: str | None) -> bool:
        return finish in ("eos", "stop")

    def _decide(
        self, ctx: StepContext, proposals: Sequence[tuple[_Plan, list[int], str]], eos: frozenset[int]
    ) -> None:
        """Accept or reject every proposal: ONE reward batch for both sides of every check, both
        response-only under the reward's own template (``reward.score``)."""
        p = self.params
        if p.rejection_sampling and proposals:
            self._score_current(ctx, [pl["state"] for pl, _, _ in proposals if pl["state"]["reward"] is None])
            calls = []
            for pl, tokens, finish in proposals:
                s = pl["state"]
                full = s["past"] + [pl["token"]] + tokens
                calls.append(
                    ScoreCall(
                        s, ctx.decode(full), len(full), component="scorer", finished=self._ended(finish)
                    )
                )
            scores: Sequence[float | None] = ctx.score(calls)
        else:
            scores = [None] * len(proposals)
        for (pl, tokens, finish), r_new in zip(proposals, scores, strict=True):
            s = pl["state"]
            stats = s["stats"]
            accept = True
            if r_new is not None:
                stats["n_acceptance_checks"] += 1
                stats["num_llm_calls"] += 2  # two RM forwards in the reference's count
                stats["rm_forward_passes"] += 1
                stats["n_rewarded_tokens"] += (
                    len(s["past"]) + 1 + len(tokens) + len(s["past"]) + len(s["ahead"])
                )
                r_old = s["reward"]
                assert r_old is not None  # scored above (_score_current) before any check
                accept = r_new > r_old
            if accept:
                s["past"] = s["past"] + [pl["token"]]
                s["ahead"], s["ahead_finish"], s["reward"] = tokens, finish, r_new
            else:
                stats["n_rejections"] += 1
                self._commit(s, 1)
            self._stop_check(s, eos)

    # ------------------------------------------------------------------ result
    def result(self, state: NablaState) -> dict[str, Any]:
        return {
            "response": state["text"],
            "reward": state["reward"],
            "finish_reason": state["finish"],
            "n_response_tokens": len(state["past"]),
            "prompt_tokens": len(state["prompt_ids"]),
            **state["stats"],
        }
