"""One ``wire(spec)``: the method, engine, reward and task a run spec names, built and checked the same
way on every path (``srdq run`` in ``local.py``, a fleet worker in ``service.py``).

``check_spec`` is the static half of the check: the method's needs against the engine's declared
capabilities (``engines.registry``, no model loaded) and the reward it needs. It runs at submit time on
both paths (``spec.prepare_run``, and again in ``service.submit`` before anything is stored), and
``wire`` runs it again before building anything, then checks the built engine's own capabilities.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from srd_worker.engines.base import CAP_LOGPROBS, Engine
from srd_worker.methods.base import Method
from srd_worker.rewards.base import RewardModel
from srd_worker.tasks.base import Task

if TYPE_CHECKING:
    from srd_worker.settings import Settings


@dataclass
class Wired:
    method: Method
    engine: Engine
    reward: RewardModel | None
    task: Task


def continues_prefix(method: Method) -> bool:
    """Whether ``method`` asks the engine to continue a partial answer (a kept prefix after the prompt):
    every method but the fixed pools (sampling, best_of_n, self_consistency) drafting their whole budget
    in one call (``chunk_tokens`` 0)."""
    params = method.params
    return not (
        getattr(type(params), "whole_budget_allowed", False) and getattr(params, "chunk_tokens", 1) == 0
    )


def check_spec(
    method: Method, *, engine: str, reward: str | None, engine_args: dict[str, Any] | None = None
) -> None:
    """Refuse ``method`` on the engine named ``engine`` (by its static capabilities with the run's checked
    ``engine_args``) or without a reward it needs: ``CapabilityError`` / ``ConfigError``. Builds and
    imports nothing heavy."""
    from srd_worker.engines.engine_args import openai_api, openai_continues
    from srd_worker.engines.registry import engine_capabilities
    from srd_worker.errors import CapabilityError
    from srd_worker.methods.registry import check_compatible
    from srd_worker.rewards.registry import REWARDS, reward_differentiable

    capabilities = engine_capabilities(engine, engine_args)
    check_compatible(
        method,
        engine_name=engine,
        capabilities=capabilities,
        has_reward=reward is not None,
        reward_name=reward,
        reward_differentiable=None if reward is None else reward_differentiable(reward),
    )
    if engine == "openai" and openai_api(engine_args) == "chat":
        entry = REWARDS.get(reward) if reward else None
        if entry is not None and entry.needs_engine and CAP_LOGPROBS not in capabilities:
            raise CapabilityError(
                f"the {reward} reward scores with the run's model (teacher-forced logprobs of given tokens), "
                "which the openai engine's chat API cannot do: use --engine-arg api=completions, or a reward "
                "of its own (arithmetic, hf-orm:MODEL, judge:MODEL)"
            )
        if not openai_continues(engine_args) and continues_prefix(method):
            raise CapabilityError(
                f"method '{method.name}' continues partial answers (chunked rounds, suffix regeneration), which "
                "the chat API cannot do without continue_final_message: drop --engine-arg "
                "continue_final_message=false (vLLM's servers support it), use api=completions, or a fixed "
                "pool (sampling, best_of_n, self_consistency) with --set chunk_tokens=0"
            )
    draft = getattr(method.params, "draft_model", None)
    if draft:  # speculative decoding: the draft model must exist before anything is stored
        from srd_worker.engines.speculative import check_draft_model

        check_draft_model(draft)


def check_task(method: Method, task: Task) -> None:
    """Refuse a task whose stop strings ``method`` would not honour (it does not sample through
    ``StepContext.generate``: ``nabla_reasoner`` and the speculative family): ``ConfigError``."""
    from srd_worker.errors import ConfigError

    if getattr(task, "stop", ()) and not method.honours_stop:
        raise ConfigError(
            f"task {task.name!r} has stop strings, which method {method.name!r} does not apply (it decodes "
            "token by token itself); remove `stop` from the task file or choose another method"
        )


def probe_sources(spec: Any, *, settings: Settings | None = None, everything: bool = True) -> None:
    """Check that the models a spec names can be loaded (``engines.loading.probe_model``: a folder's
    config, weights and tokenizer, a built-in model's package, a cached hub id), for the policy and for
    a reward or judge backed by a model: ``ModelLoadError`` before anything is written. ``everything``
    (``srdq run``: the models must be on this machine); otherwise (``srdq submit``: the workers load
    them) only names that are folders here are checked. The openai engine's model and an ``openai-rm``
    reward's are on their servers (``srdq run`` checks that ``SRDQ_RM_BASE_URL`` is set), as is a judge's
    with ``SRDQ_JUDGE_ENGINE=openai`` (``SRDQ_JUDGE_BASE_URL``). With ``everything``, what runs on vLLM
    (the engine, a ``vllm-rm``, a judge with ``SRDQ_JUDGE_ENGINE=vllm``) needs vLLM installed here:
    ``ConfigError`` with the install line otherwise."""
    from pathlib import Path

    from srd_worker.engines.loading import TINY_MODEL, probe_model, refuse_tiny_args
    from srd_worker.extras import require_vllm
    from srd_worker.rewards.registry import (
        JUDGE_KINDS,
        MODEL_REWARDS,
        judge_server_url,
        parse_reward_name,
        rm_server_url,
    )

    def probe(name: str, what: str, remote: bool) -> None:
        if everything or Path(name).exists():
            probe_model(name, what=what, allow_remote=remote)

    if spec.engine != "openai":
        probe(spec.model, "model", spec.engine == "vllm")
    if spec.engine == "transformers" and spec.model == TINY_MODEL:
        refuse_tiny_args(spec.engine_args or {})
    if everything and spec.engine == "vllm":
        require_vllm("the 'vllm' engine", "run with --engine transformers")
    reward = spec.reward
    if reward and ":" in reward and reward.partition(":")[0] in MODEL_REWARDS:
        kind, model, _style = parse_reward_name(reward)
        judge_engine = settings.judge_engine if settings is not None else "transformers"
        if kind in JUDGE_KINDS and judge_engine == "openai":  # on its server: srdq run needs the URL here
            if everything and settings is not None:
                judge_server_url(settings)
            return
        if kind == "openai-rm":  # the model is on its server; srdq run needs the server's URL here
            if everything and settings is not None:
                rm_server_url(settings)
            return
        remote = kind == "vllm-rm" or (kind in JUDGE_KINDS and judge_engine == "vllm")
        probe(model, f"reward model ({kind})", remote)
        if everything and kind == "vllm-rm":
            require_vllm("the 'vllm-rm' reward", "use hf-orm:MODEL")
        elif everything and remote:
            require_vllm(f"a {kind} reward with SRDQ_JUDGE_ENGINE=vllm", "set SRDQ_JUDGE_ENGINE=transformers")


def wire(spec: Any, *, settings: Settings, engine: Engine | None = None) -> Wired:
    """Build what ``spec`` (a ``spec.RunSpec``, the layer above, so not named in the signature) runs with:
    the method from its name and params, the engine (``engine`` if given, e.g. a worker's cached one, else
    built from ``spec.engine`` and ``spec.model``),
    the reward over that engine, and the task with its ``--field`` mapping. Raises before building the
    engine when the spec is incompatible, and after when the built engine lacks a capability."""
    from srd_worker.engines.registry import build_engine
    from srd_worker.methods.registry import build_method, check_compatible
    from srd_worker.rewards.base import differentiable
    from srd_worker.rewards.registry import build_reward
    from srd_worker.tasks.registry import get_task

    engine_args = dict(getattr(spec, "engine_args", None) or {})
    method = build_method(spec.method, spec.params)
    check_spec(method, engine=spec.engine, reward=spec.reward, engine_args=engine_args)
    task = get_task(spec.task, fields=spec.fields, definition=getattr(spec, "task_def", None))
    check_task(method, task)
    if engine is None:
        engine = build_engine(spec.engine, spec.model, settings, engine_args)
    reward = build_reward(spec.reward, engine, settings=settings) if spec.reward else None
    check_compatible(
        method,
        engine_name=engine.name,
        capabilities=engine.capabilities,
        has_reward=reward is not None,
        reward_name=spec.reward,
        reward_differentiable=None if reward is None else differentiable(reward),
    )
    return Wired(method=method, engine=engine, reward=reward, task=task)
