"""Process reward model: step-separated scoring with a Hugging Face token-level head (ALGORITHMS.md §0.2).

The reward of a (question, response) pair is the PRM's score of the LAST COMPLETED STEP [PROPOSED in
§0.2]: the response is split into steps on ``step_separator``; a step is completed when a separator follows
it, so a response that ends mid-step is scored on the steps completed so far and its unfinished tail is
ignored. Whitespace-only steps are skipped. When no step is completed yet, the text so far (possibly empty)
is scored as one step, so every response gets a score. ``score(..., finished=[...])`` marks responses that
have ended (EOS or stop string): their trailing step counts as completed, so a final answer written after
the last separator is scored. The methods pass it through ``ScoreCall.finished`` (see ``rewards/base.py``);
a caller that omits it has every response treated as possibly partial.

Two conventions, chosen by ``style``:

``qwen`` (Qwen2.5-Math-PRM). The RM's chat template with system (the model card's prompt by default),
user = question, assistant = the steps joined by the step token ``<extra_0>`` and ended by it. A
2-class token head gives logits at every position; the score is softmax(logits)[1] (probability that the
step is correct) at the last ``<extra_0>``. Steps default to splitting on a blank line (``"\\n\\n"``), as in
the model card. Loaded as ``AutoModelForTokenClassification(num_labels=2)``; the released checkpoint's
head (``score.0`` linear, ReLU, ``score.2`` linear: its custom ``Qwen2ForProcessRewardModel`` class) is
rebuilt from the checkpoint's tensors, so no remote code is run.

``skywork`` (Skywork-o1-Open-PRM). Our reading of SkyworkAI/skywork-o1-prm-inference (not on PyPI): no chat
template; input ids are ``encode(bos + question + "\\n")`` followed, per step, by ``encode(step)`` and the
step token (the last token of ``encode(step_separator)``); the model's value head (``v_head.summary``, one
linear unit on the last hidden state) gives a scalar at every token, and a step's score is the sigmoid of
that scalar at the step's closing step token. Skywork's code splits on a single newline, the default here.
We implement it as ``AutoModelForTokenClassification(num_labels=1)`` + sigmoid; the released checkpoint's
``v_head.summary`` weights are copied into that head when loading. A tokenizer without a BOS token (Qwen2.5)
gets no BOS.

Batching: sorted by length and packed under ``max_tokens_per_batch`` padded tokens; scores in input order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from srd_worker.errors import RewardError
from srd_worker.rewards.batching import cut_at_stop
from srd_worker.rewards.hf_common import (
    SOFT_MARK,
    SoftScoring,
    checkpoint_tensors,
    load_head_model,
    load_tokenizer,
    pad_id_of,
    resolve_device,
    right_padded,
    run_batches,
    split_at_mark,
)
from srd_worker.rewards.hf_orm import check_pairs, rm_chat_ids, rm_chat_text

STYLES = ("qwen", "skywork")
QWEN_STEP_TOKEN = "<extra_0>"
QWEN_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
DEFAULT_SEPARATOR = {"qwen": "\n\n", "skywork": "\n"}


def split_steps(response: str, separator: str, *, finished: bool = False) -> list[str]:
    """The steps to score: the completed ones (the tail too when ``finished``), or the whole text as one
    step when none is completed. See the module docstring."""
    if not separator:
        raise RewardError("the step separator must not be empty")
    pieces = response.split(separator)
    steps = [p for p in pieces[:-1] if p.strip()]
    if finished and pieces[-1].strip():
        steps.append(pieces[-1])
    return steps or [pieces[-1] if pieces[-1].strip() else ""]


def _skywork_remap(model: Any, path: str) -> set[str]:
    """Copy a Skywork checkpoint's ``v_head.summary`` into the token head ``score``."""
    import torch

    t = checkpoint_tensors(path, ["v_head.summary.weight", "v_head.summary.bias"])
    if "v_head.summary.weight" not in t or tuple(t["v_head.summary.weight"].shape) != tuple(
        model.score.weight.shape
    ):
        return set()
    with torch.no_grad():
        model.score.weight.copy_(t["v_head.summary.weight"])
        restored = {"score.weight"}
        if getattr(model.score, "bias", None) is not None and "v_head.summary.bias" in t:
            model.score.bias.copy_(t["v_head.summary.bias"])
            restored.add("score.bias")
    return restored


def _qwen_remap(model: Any, path: str) -> set[str]:
    """Rebuild Qwen2.5-Math-PRM's two-layer head (``score.0``, ReLU, ``score.2``) from the checkpoint."""
    import torch

    names = ["score.0.weight", "score.0.bias", "score.2.weight", "score.2.bias"]
    t = checkpoint_tensors(path, names)
    if any(n not in t for n in names):
        return set()
    hidden, out = t["score.0.weight"].shape[1], t["score.2.weight"].shape[0]
    ref = next(model.parameters())
    head = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, out))
    with torch.no_grad():
        for n in names:
            head.get_parameter(n.removeprefix("score.")).copy_(t[n])
    model.score = head.to(device=ref.device, dtype=ref.dtype)
    return {"score.weight", "score.bias"}


class HFProcessReward(SoftScoring):
    """Score of the last completed step under a PRM (module docstring for the two styles)."""

    def __init__(
        self,
        model_name_or_path: str,
        *,
        style: str = "qwen",
        device: str = "auto",
        dtype: Any = "bfloat16",
        max_tokens_per_batch: int = 16384,
        step_separator: str | None = None,
        step_token: str | None = None,
        system: str | None = "auto",
        stop: Sequence[str] = (),
    ) -> None:
        from transformers import AutoModelForTokenClassification

        if style not in STYLES:
            raise RewardError(f"unknown PRM style '{style}'; choose one of: {', '.join(STYLES)}")
        if max_tokens_per_batch < 1:
            raise RewardError(f"max_tokens_per_batch must be >= 1, got {max_tokens_per_batch}")
        self.style = style
        self.name = f"hf-prm:{model_name_or_path}:{style}"
        self.model_name = str(model_name_or_path)
        self.max_tokens_per_batch = int(max_tokens_per_batch)
        self.step_separator = step_separator if step_separator is not None else DEFAULT_SEPARATOR[style]
        if not self.step_separator:
            raise RewardError("step_separator must not be empty")
        self.stop = tuple(stop)
        self.device = resolve_device(device)
        self.tokenizer = load_tokenizer(self.model_name)
        if style == "qwen":
            self.system = QWEN_SYSTEM if system == "auto" else system
            self.step_token = step_token or QWEN_STEP_TOKEN
            ids = self.tokenizer.encode(self.step_token, add_special_tokens=False)
            if len(ids) != 1:
                raise RewardError(
                    f"the tokenizer of '{self.model_name}' does not have '{self.step_token}' as one "
                    f"token (got {len(ids)} tokens); a qwen-style PRM needs its step token"
                )
            self.step_token_id = int(ids[0])
        else:
            self.system = None
            self.step_token = step_token or self.step_separator
            ids = self.tokenizer.encode(self.step_token, add_special_tokens=False)
            if not ids:
                raise RewardError(f"the step token {self.step_token!r} encodes to no token")
            self.step_token_id = int(ids[-1])
        self.model = load_head_model(
            AutoModelForTokenClassification,
            self.model_name,
            num_labels=2 if style == "qwen" else 1,
            dtype=dtype,
            device=self.device,
            remap=_qwen_remap if style == "qwen" else _skywork_remap,
        )
        self.pad_id = pad_id_of(self.tokenizer)
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or None

    # ------------------------------------------------------------------ inputs
    def input_ids(self, question: str, response: str, *, finished: bool = False) -> tuple[list[int], int]:
        """(token ids, index of the token whose score is the reward: the last completed step's end)."""
        steps = split_steps(cut_at_stop(response, self.stop), self.step_separator, finished=finished)
        if self.style == "qwen":
            body = self.step_token.join(steps) + self.step_token
            ids = rm_chat_ids(self.tokenizer, question, body, system=self.system)
            where = [k for k, t in enumerate(ids) if t == self.step_token_id]
            if not where:
                raise RewardError(f"the chat template of '{self.model_name}' dropped the step token")
            return ids, where[-1]
        tok = self.tokenizer
        ids = list(tok.encode((tok.bos_token or "") + question + "\n", add_special_tokens=False))
        for step in steps:
            ids += list(tok.encode(step, add_special_tokens=False)) if step else []
            ids.append(self.step_token_id)
        return ids, len(ids) - 1

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], *, finished: Sequence[bool] | None = None
    ) -> list[float]:
        check_pairs(prompts, responses)
        if finished is not None and len(finished) != len(responses):
            raise RewardError(f"got {len(finished)} finished flags for {len(responses)} responses")
        flags = list(finished) if finished is not None else [False] * len(responses)
        items = [
            self.input_ids(q, r, finished=bool(f)) for q, r, f in zip(prompts, responses, flags, strict=True)
        ]
        for i, (ids, _pos) in enumerate(items):
            if self.max_context and len(ids) > self.max_context:
                raise RewardError(
                    f"item {i}: the reward input has {len(ids)} tokens, more than the reward "
                    f"model's context of {self.max_context}"
                )
        return run_batches(
            [len(ids) for ids, _ in items],
            self.max_tokens_per_batch,
            lambda batch: self._score_batch([items[i] for i in batch]),
        )

    # ------------------------------------------------------------------ differentiable score (SoftScoring)
    def soft_layout(self, question: str, prefix: str) -> tuple[list[int], list[int], int]:
        """(ids before the soft tokens, ids after them, index in the after-ids of the scored step token).

        The response (``prefix`` + soft tokens) is laid out VERBATIM as one closing step: its separators
        stay text, and one step token follows the soft tokens, where the score is read. This is the
        layout ``score(..., finished=True)`` uses for a one-step response; for a response of several steps
        ``score`` replaces each separator by a step token instead, so the soft score is an approximation
        of the PRM's judgement of the whole response as its last step (documented in ALGORITHMS.md §9.4)."""
        prefix = cut_at_stop(prefix, self.stop)
        if self.style == "qwen":
            text = rm_chat_text(
                self.tokenizer, question, prefix + SOFT_MARK + self.step_token, system=self.system
            )
            before, after = split_at_mark(self.tokenizer, text)
            where = [k for k, t in enumerate(after) if t == self.step_token_id]
            if not where:
                raise RewardError(f"the chat template of '{self.model_name}' dropped the step token")
            return before, after, where[0]
        tok = self.tokenizer
        before = list(tok.encode((tok.bos_token or "") + question + "\n", add_special_tokens=False))
        before += list(tok.encode(prefix, add_special_tokens=False)) if prefix else []
        return before, [self.step_token_id], 0

    def soft_score(self, question: str, prefix: str, soft: Any, policy_vocab: Sequence[str | None]) -> Any:
        """The PRM's step score at the step token closing (question, ``prefix`` + soft tokens), laid out by
        ``soft_layout``; differentiable w.r.t. ``soft`` (rewards/base.py ``DifferentiableReward``)."""
        import torch

        before, after, at = self.soft_layout(question, prefix)
        emb = self._soft()
        embeds = emb.embed(before, soft, after, policy_vocab)
        if self.max_context and embeds.shape[1] > self.max_context:
            raise RewardError(
                f"the reward input has {embeds.shape[1]} tokens, more than the reward model's context "
                f"of {self.max_context}"
            )
        pos = len(before) + int(soft.shape[0]) + at
        with torch.enable_grad():
            logits = self.model(inputs_embeds=embeds).logits[0, pos].float()
        emb.forward_passes += 1
        return torch.softmax(logits[:2], dim=-1)[1] if self.style == "qwen" else torch.sigmoid(logits[0])

    def _score_batch(self, items: list[tuple[list[int], int]]) -> list[float]:
        import torch

        ids, mask = right_padded([s for s, _ in items], self.pad_id, self.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask).logits.float()
        rows = torch.arange(len(items), device=logits.device)
        at = logits[rows, torch.tensor([p for _, p in items], device=logits.device)]
        if self.style == "qwen":
            scores = torch.softmax(at[:, :2], dim=-1)[:, 1]
        else:
            scores = torch.sigmoid(at[:, 0])
        return [float(x) for x in scores.cpu()]
