"""What every decoding method shares: typed params, explicit per-item state, the step context.

A method (DESIGN.md, Contracts: Method) is
- a frozen ``Params`` dataclass whose fields carry their documentation (``help``) and defaults,
- a JSON-serialisable per-item ``state`` dict (so the runner can checkpoint after every round): an
  ``ItemState`` (the fields below) that each method extends with its own ``TypedDict`` (``pool.py``,
  ``srd_loop.py``, ``speculative_rejection.py``); the dict types are only annotations, the checkpoint is
  the plain JSON of the dict, keys in the order the constructors write them,
- ``step(states, ctx)``: one round over many items at once, so the engine sees one large batch,
- ``done(state)`` and ``result(state)``.

Methods import only the Engine/RewardModel protocols. All randomness comes from ``ctx.seed(...)``,
derived from (run seed, item id, candidate, round, call kind), so a resumed shard reproduces an
uninterrupted one. The ``StepContext`` also keeps the per-item compute ledger (ALGORITHMS.md §0.3):
generated and prefill tokens, LM and reward calls, and per-component invocations and wall time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypedDict, TypeVar, cast

from pydantic import Field, TypeAdapter, ValidationError

from srd_worker.engines.base import CAP_SAMPLING, Engine, Generation, GenerationRequest, SamplingParams
from srd_worker.errors import ConfigError
from srd_worker.rewards.base import RewardModel, accepts_finished
from srd_worker.votes import whitespace_classes

COMPONENTS = ("drafter", "scorer", "editor", "router")


def param(default: Any, help: str, *, in_id_at_default: bool = True, **kwargs: Any) -> Any:
    """A documented method parameter (``help`` is shown by ``srdq methods``). ``in_id_at_default=False``
    for a parameter added after runs were made: ``to_dict`` (so the spec and its run id) leaves it out
    while it holds its default, so those runs keep their ids and resume."""
    return dataclasses.field(
        default=default, metadata={"help": help, "in_id_at_default": in_id_at_default, **kwargs}
    )


def _coerce(name: str, typ: Any, value: Any) -> Any:
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        typ = args[0]
    if typ in (bool, int, float):
        # pydantic's lax mode: "3", 3.0 and "3.0" are 3; "3.7", 3.7 and "1e3" are refused, not truncated;
        # floats must be finite; "yes"/"off"/"1" are booleans. A bool is never taken as a number.
        if typ is not bool and isinstance(value, bool):
            raise ConfigError(f"parameter '{name}' expects {_EXPECTS[typ]}, got {value!r}")
        try:
            return _ADAPTERS[typ].validate_python(value.strip() if isinstance(value, str) else value)
        except ValidationError as exc:
            what = "a finite number" if "finite" in str(exc) else _EXPECTS[typ]
            raise ConfigError(f"parameter '{name}' expects {what}, got {value!r}") from None
    if typ is str:
        return str(value)
    return value


_ADAPTERS: dict[type, TypeAdapter[Any]] = {
    bool: TypeAdapter(bool),
    int: TypeAdapter(int),
    float: TypeAdapter(typing.Annotated[float, Field(allow_inf_nan=False)]),
}
_EXPECTS = {bool: "true/false", int: "an integer", float: "a number"}
#: The largest pool a method accepts (``n``): a state holds every candidate, so a pool far beyond what any
#: paper uses (256 in search-and-learn's Best-of-N curves) is a typo, refused before anything is written.
MAX_CANDIDATES = 4096
#: The largest generation budget a method accepts (2^20 tokens, beyond every model's context here).
MAX_NEW_TOKENS = 1 << 20


@dataclasses.dataclass(frozen=True)
class MethodParams:
    """Base for method parameters. Subclasses add documented fields and override ``validate``."""

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, method: str = "") -> MethodParams:
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            valid = ", ".join(sorted(fields)) or "(none)"
            raise ConfigError(
                f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(repr(u) for u in unknown)} "
                f"for method '{method or cls.__name__}'; valid: {valid}"
            )
        coerced = {k: _coerce(k, hints[k], v) for k, v in values.items()}
        obj = cls(**coerced)
        n = getattr(obj, "n", None)
        if isinstance(n, int) and n > MAX_CANDIDATES:
            raise ConfigError(f"n = {n} candidates per problem is more than srdq accepts ({MAX_CANDIDATES})")
        budget = getattr(obj, "max_new_tokens", None)
        if isinstance(budget, int) and budget > MAX_NEW_TOKENS:
            raise ConfigError(
                f"max_new_tokens = {budget} is more than any model's context; srdq accepts up to {MAX_NEW_TOKENS}"
            )
        obj.validate()
        return obj

    def validate(self) -> None:
        """Raise ConfigError for out-of-range values."""

    def to_dict(self) -> dict[str, Any]:
        """The parameters, except those marked ``in_id_at_default=False`` that hold their default."""
        out = dataclasses.asdict(self)
        for f in dataclasses.fields(self):
            if not f.metadata.get("in_id_at_default", True) and out.get(f.name) == f.default:
                del out[f.name]
        return out

    @classmethod
    def describe(cls) -> list[tuple[str, str, Any, str]]:
        """(name, type, default, help) for every field."""
        hints = typing.get_type_hints(cls)
        rows = []
        for f in dataclasses.fields(cls):
            typ = hints[f.name]
            tname = getattr(typ, "__name__", None) or str(typ).replace("typing.", "")
            rows.append((f.name, tname, f.default, f.metadata.get("help", "")))
        return rows


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def derive_seed(run_seed: int, item_id: str, candidate: int, round_: int, kind: str) -> int:
    """A 63-bit seed for one random draw, stable across processes and Python versions."""
    key = f"{run_seed}|{item_id}|{candidate}|{round_}|{kind}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") & ((1 << 63) - 1)


class ComponentLedger(TypedDict):
    """Invocations and tokens of one component (drafter, scorer, editor, router)."""

    calls: int  # batches the item took part in (one per engine/reward batch, one per routing pass)
    in_tokens: int
    out_tokens: int


class Ledger(TypedDict):
    """The per-item compute ledger (ALGORITHMS.md §0.3)."""

    gen_tokens: int
    prefill_tokens: int
    lm_calls: int
    rm_calls: int  # responses the reward model scored (score-cache misses only)
    rm_tokens: int  # response tokens of those
    rm_cache_hits: int  # responses whose score came from the score cache (no reward call)
    rm_cache_hit_tokens: int  # response tokens of those (scoring the cache saved)
    components: dict[str, ComponentLedger]  # keyed by COMPONENTS


class ItemState(TypedDict):
    """Fields every method state has (``new_state``); methods extend it."""

    item_id: str
    question: str
    prompt_ids: list[int]
    round: int
    done: bool
    ledger: Ledger
    timing: dict[str, float]  # wall seconds per component (not deterministic: kept out of the ledger)


StateT = TypeVar("StateT", bound=ItemState)
ParamsT = TypeVar("ParamsT", bound=MethodParams)


def new_ledger() -> Ledger:
    """Per-item compute counts (deterministic; wall time is kept apart in ``state['timing']``)."""
    return {
        "gen_tokens": 0,
        "prefill_tokens": 0,
        "lm_calls": 0,
        "rm_calls": 0,
        "rm_tokens": 0,
        "rm_cache_hits": 0,
        "rm_cache_hit_tokens": 0,
        "components": {c: {"calls": 0, "in_tokens": 0, "out_tokens": 0} for c in COMPONENTS},
    }


def new_timing() -> dict[str, float]:
    return {c: 0.0 for c in COMPONENTS}


def new_state(item_id: str, question: str, prompt_ids: Sequence[int]) -> ItemState:
    """Fields every method state has."""
    return {
        "item_id": item_id,
        "question": question,
        "prompt_ids": list(prompt_ids),
        "round": 0,
        "done": False,
        "ledger": new_ledger(),
        "timing": new_timing(),
    }


@dataclasses.dataclass
class GenCall:
    """One generation request of a round, with the item state it is charged to."""

    state: ItemState
    prompt_ids: Sequence[int]
    params: SamplingParams
    component: str = "drafter"


@dataclasses.dataclass
class ScoreCall:
    state: ItemState
    response: str
    n_tokens: int
    component: str = "scorer"
    finished: bool = False  # the response is complete (EOS / stop string), not a prefix


class ScoreCache(Protocol):
    """Reward scores already computed, by content (``store.score_cache.SqlScoreCache``; README, *Score
    cache*). ``key`` names one (question, response, finished) input under the cache's reward identity;
    ``lookup`` returns the scores it holds for some of ``keys``; ``add`` records newly computed ones (the
    runner makes them durable with the round's checkpoint, ``flush``)."""

    def key(self, question: str, response: str, finished: bool) -> str: ...

    def lookup(self, keys: Sequence[str]) -> dict[str, float]: ...

    def add(self, scores: dict[str, float]) -> None: ...

    def flush(self) -> None: ...


class _FinishedAwareReward(Protocol):
    """A reward whose ``score`` takes the optional ``finished`` keyword (``rewards.base.accepts_finished``)."""

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], *, finished: Sequence[bool]
    ) -> list[float]: ...


class StepContext:
    """What a method may use during a round: the engine, the reward model, seeds, the ledger."""

    def __init__(
        self,
        engine: Engine,
        reward: RewardModel | None,
        run_seed: int,
        extract_answer: Callable[[str], str | None] | None = None,
        stop: Sequence[str] = (),
        score_cache: ScoreCache | None = None,
        answer_classes: Callable[[Sequence[str | None]], list[int | None]] | None = None,
    ) -> None:
        self.engine = engine
        #: the task's stop strings, added to every request's own (``generate``)
        self.stop = tuple(stop)
        self.reward = reward
        self.score_cache = score_cache
        self.run_seed = run_seed
        self.extract_answer = extract_answer or (lambda text: None)
        #: the vote class of each answer (``votes.answer_classes`` with the task's equivalence;
        #: without a task, whitespace-normalised strings): majority votes count classes, not strings
        self.answer_classes = answer_classes or whitespace_classes
        self._reward_takes_finished = reward is not None and accepts_finished(reward)

    def seed(self, state: ItemState, candidate: int, kind: str, *, by_round: bool = True) -> int:
        """The seed of one engine request. ``by_round=False`` leaves the item's round out (round 0):
        for draws named by something that does not depend on when they happen (SRD's edits)."""
        return derive_seed(
            self.run_seed, state["item_id"], candidate, state["round"] if by_round else 0, kind
        )

    def _params(self, call: GenCall) -> SamplingParams:
        """The call's sampling params with the task's stop strings added (the call's own first)."""
        if not self.stop:
            return call.params
        stop = tuple(dict.fromkeys((*call.params.stop, *self.stop)))
        return dataclasses.replace(call.params, stop=stop)

    def generate(self, calls: Sequence[GenCall]) -> list[Generation]:
        """ONE engine batch for every call; tokens and time are charged to each call's item."""
        if not calls:
            return []
        t0 = time.perf_counter()
        gens = self.engine.generate([GenerationRequest(tuple(c.prompt_ids), self._params(c)) for c in calls])
        elapsed = time.perf_counter() - t0
        if len(gens) != len(calls):
            raise RuntimeError(f"engine returned {len(gens)} generations for {len(calls)} requests")
        total_out = sum(len(g.token_ids) for g in gens) or 1
        touched: dict[int, tuple[ItemState, str]] = {}
        for c, g in zip(calls, gens, strict=True):
            led = c.state["ledger"]
            comp = led["components"][c.component]
            led["gen_tokens"] += len(g.token_ids)
            led["prefill_tokens"] += len(c.prompt_ids)
            led["lm_calls"] += 1
            comp["in_tokens"] += len(c.prompt_ids)
            comp["out_tokens"] += len(g.token_ids)
            c.state["timing"][c.component] += elapsed * len(g.token_ids) / total_out
            touched[id(c.state)] = (c.state, c.component)
        for state, component in touched.values():
            state["ledger"]["components"][component]["calls"] += 1
        return gens

    def score(self, calls: Sequence[ScoreCall]) -> list[float]:
        """ONE reward batch for every call (question, partial or full response).

        With a ``score_cache``, calls whose input it holds (or that repeat an earlier call of this batch)
        are not sent to the reward: each counts as a cache hit (``rm_cache_hits``, ``rm_cache_hit_tokens``),
        never as a reward call; ``rm_calls`` / ``rm_tokens`` and the scorer's invocations and input tokens
        count the misses only. The reward's wall time is charged to the calls it scored, the lookup's to
        every call."""
        if not calls:
            return []
        if self.reward is None:
            raise ConfigError("this method needs a reward model; pass --reward")
        t0 = time.perf_counter()
        cache = self.score_cache
        finished = [c.finished and self._reward_takes_finished for c in calls]
        keys: list[str] | None = None
        known: dict[str, float] = {}
        if cache is not None:
            keys = [
                cache.key(c.state["question"], c.response, f) for c, f in zip(calls, finished, strict=True)
            ]
            known = dict(cache.lookup(keys))
        # the inputs to send: every call without a cache, else one per distinct key the cache lacks
        todo: list[int] = []
        first_of: dict[str, int] = {}
        for i in range(len(calls)):
            if keys is None:
                todo.append(i)
            elif keys[i] not in known and keys[i] not in first_of:
                first_of[keys[i]] = i
                todo.append(i)
        scored = set(todo)
        t1 = time.perf_counter()
        computed = self._score_batch([calls[i] for i in todo], [finished[i] for i in todo]) if todo else []
        elapsed = time.perf_counter() - t1
        scores: list[float] = [0.0] * len(calls)
        for i, s in zip(todo, computed, strict=True):
            scores[i] = s
        if keys is not None and cache is not None:
            fresh = {keys[i]: s for i, s in zip(todo, computed, strict=True)}
            cache.add({k: s for k, s in fresh.items() if math.isfinite(s)})
            for i, k in enumerate(keys):
                if i not in scored:
                    scores[i] = known[k] if k in known else fresh[k]
        lookup_share = (t1 - t0) / len(calls)
        touched: dict[int, tuple[ItemState, str]] = {}
        for i, c in enumerate(calls):
            led = c.state["ledger"]
            c.state["timing"][c.component] += lookup_share
            if i in scored:
                led["rm_calls"] += 1
                led["rm_tokens"] += c.n_tokens
                led["components"][c.component]["in_tokens"] += c.n_tokens
                c.state["timing"][c.component] += elapsed / len(todo)
                touched[id(c.state)] = (c.state, c.component)
            else:  # a state checkpointed before the score cache existed lacks these two counters
                led["rm_cache_hits"] = led.get("rm_cache_hits", 0) + 1
                led["rm_cache_hit_tokens"] = led.get("rm_cache_hit_tokens", 0) + c.n_tokens
        for state, component in touched.values():
            state["ledger"]["components"][component]["calls"] += 1
        return scores

    def _score_batch(self, calls: Sequence[ScoreCall], finished: Sequence[bool]) -> list[float]:
        """The reward's scores of ``calls`` (one batch), as floats."""
        assert self.reward is not None  # checked by ``score``
        prompts, responses = [c.state["question"] for c in calls], [c.response for c in calls]
        if self._reward_takes_finished:
            # accepts_finished(reward) was checked in __init__: its score takes ``finished``
            scores = cast(_FinishedAwareReward, self.reward).score(
                prompts, responses, finished=list(finished)
            )
        else:
            scores = self.reward.score(prompts, responses)
        if len(scores) != len(calls):
            raise RuntimeError(f"reward returned {len(scores)} scores for {len(calls)} responses")
        return [float(s) for s in scores]

    def decode(self, ids: Sequence[int]) -> str:
        return self.engine.tokenizer.decode(ids)


class Method(Generic[StateT, ParamsT]):
    """Base class: subclasses set ``name``, ``Params``, ``needs_reward`` and implement the hooks.

    ``StateT`` is the method's state type (an ``ItemState`` extension); ``ParamsT`` the type of its
    ``params`` (its ``Params`` class)."""

    name: ClassVar[str]
    Params: ClassVar[type[MethodParams]]
    summary: ClassVar[str] = ""
    needs_reward: ClassVar[bool] = False
    #: the reward must have a differentiable score (gradient-based decoding: ∇-Reasoner)
    needs_differentiable_reward: ClassVar[bool] = False
    needs_capabilities: ClassVar[frozenset[str]] = frozenset({CAP_SAMPLING})
    #: the method samples through ``StepContext.generate``, so a task's stop strings apply to it
    honours_stop: ClassVar[bool] = True

    def __init__(self, params: ParamsT) -> None:
        self.params = params

    def init_state(self, item_id: str, question: str, prompt_ids: Sequence[int]) -> StateT:
        raise NotImplementedError

    def step(self, states: list[StateT], ctx: StepContext) -> list[StateT]:
        raise NotImplementedError

    #: adaptive methods (SRD, rejection sampling, Speculative Rejection, beam search, DVTS): the runner
    #: records, after every round, the answer ``current_best`` gives and the tokens spent so far
    #: (``runner.anytime_entry``; the anytime curve of ``srdq report``)
    anytime: ClassVar[bool] = False

    def done(self, state: StateT) -> bool:
        return bool(state["done"])

    def width(self, state: StateT) -> int:
        """Rows the item's next step generates, for the runner's row cap (``SRDQ_BATCH_ROWS``, which packs
        each step's items by it): its candidates not finished yet (each one a row of the step's draft
        batch), else its ``n``, at least 1. A method whose steps are shaped otherwise overrides it (SRD:
        a refinement wave's regenerations); an estimate, not a limit, for the others (beams)."""
        candidates = state.get("candidates")
        if isinstance(candidates, list) and candidates:
            return max(1, sum(1 for c in candidates if isinstance(c, dict) and c.get("finish") is None))
        return max(1, int(getattr(self.params, "n", 1) or 1))

    def current_best(self, state: StateT, ctx: StepContext) -> tuple[str, float | None]:
        """(response, reward) the method would return if it were stopped after this round: its current
        best by reward, chosen as ``result`` chooses; ("", None) while it has nothing to return. Pure: the
        state is not changed. Only methods with ``anytime`` implement it."""
        raise NotImplementedError

    def result(self, state: StateT) -> dict[str, Any]:
        raise NotImplementedError
