"""The Hugging Face reward adapters (hf-orm, hf-prm) on tiny randomly initialised models built here.

Each model is a 2-layer Llama with a classification head (LlamaForSequenceClassification, num_labels=1;
LlamaForTokenClassification, num_labels 2 or 1), saved with the byte tokenizer of ``build_tiny_llama``
(plus the ``<extra_0>`` step token) to a folder and loaded by path, as a user's checkpoint would be.
Checked: scores equal a direct forward pass of the model; batching under the token budget keeps the
input order and equals one-at-a-time scoring; a partial response is scored on its last completed step;
the released checkpoints' head layouts (Skywork ``v_head.summary``, Qwen2.5-Math-PRM two-layer ``score``)
load into the same adapters; bad inputs give clear errors.
"""

from __future__ import annotations

import pytest

from srd_worker.errors import ConfigError, RewardError
from srd_worker.rewards.batching import cut_at_stop, pack_batches
from tests.threads import TORCH_THREADS

QUESTIONS = ["What is 2+2?", "Name a duck.", "Sum 1..10?", "x", "Why?", "Is 7 prime?"]
RESPONSES = [
    "2+2 = 4.\n\nThe answer is 4.",
    "Donald",
    "Pair terms.\n\nThere are 5 pairs of 11.\n\nSo the sum is 55",
    "",
    "Because.\n\n",
    "7 has no divisors but 1 and itself.\n\nSo yes, it is prime, as " + "we checked carefully " * 6,
]


def _tokenizer():
    from srd_worker.engines.loading import build_tiny_llama

    _, tok = build_tiny_llama()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<extra_0>"]})
    return tok


def _config(tok, num_labels: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        num_labels=num_labels,
        initializer_range=0.2,
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Saved checkpoints by kind -> (path, the in-memory model)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification, LlamaForTokenClassification

    torch.set_num_threads(TORCH_THREADS)
    root = tmp_path_factory.mktemp("rms")
    tok = _tokenizer()
    out = {}

    def save(kind, model):
        path = root / kind
        model.save_pretrained(path)
        tok.save_pretrained(path)
        out[kind] = (str(path), model.eval())

    torch.manual_seed(1)
    save("orm", LlamaForSequenceClassification(_config(tok, 1)))
    save("prm2", LlamaForTokenClassification(_config(tok, 2)))
    save("prm1", LlamaForTokenClassification(_config(tok, 1)))
    save("causal", LlamaForCausalLM(_config(tok, 1)))
    # Qwen2.5-Math-PRM layout: score = Linear(H, H), ReLU, Linear(H, 2)
    qwen = LlamaForTokenClassification(_config(tok, 2))
    qwen.score = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    save("qwen_layout", qwen)
    # Skywork layout: the head's weights stored as v_head.summary.{weight,bias}
    sky_path = root / "sky_layout"
    sky_path.mkdir()
    src = out["prm1"][0]
    tensors = load_file(f"{src}/model.safetensors")
    tensors = {
        k.replace("score.", "v_head.summary.") if k.startswith("score.") else k: v for k, v in tensors.items()
    }
    save_file(tensors, str(sky_path / "model.safetensors"), metadata={"format": "pt"})
    out["prm1"][1].config.save_pretrained(sky_path)
    tok.save_pretrained(sky_path)
    out["sky_layout"] = (str(sky_path), out["prm1"][1])
    return out


def _orm(models, **kw):
    from srd_worker.rewards.hf_orm import HFOutcomeReward

    return HFOutcomeReward(models["orm"][0], device="cpu", dtype="float32", **kw)


def _prm(models, kind, style, **kw):
    from srd_worker.rewards.hf_prm import HFProcessReward

    return HFProcessReward(models[kind][0], style=style, device="cpu", dtype="float32", **kw)


def _count_batches(monkeypatch, reward):
    calls = []
    original = reward._score_batch

    def spy(items):
        calls.append(len(items))
        return original(items)

    monkeypatch.setattr(reward, "_score_batch", spy)
    return calls


# ------------------------------------------------------------------------------------- batching helpers


def test_pack_batches_respects_budget_and_covers_every_index():
    lengths = [5, 40, 12, 12, 3, 100, 7]
    batches = pack_batches(lengths, 48)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 48
    assert [5] in batches  # longer than the budget: alone
    assert batches[0] == [5]  # longest first
    assert pack_batches([], 10) == []
    with pytest.raises(RewardError, match="max_tokens_per_batch"):
        pack_batches([1], 0)


def test_cut_at_stop():
    assert cut_at_stop("answer 4\nQuestion: next", ["\nQuestion:", "</s>"]) == "answer 4"
    assert cut_at_stop("no stop here", ["Q:"]) == "no stop here"
    assert cut_at_stop("a</s>b Q: c", ["Q:", "</s>"]) == "a"


# ------------------------------------------------------------------------------------- ORM


def test_orm_score_is_the_head_logit_at_the_last_token(models):
    import torch

    rm = _orm(models)
    scores = rm.score(QUESTIONS, RESPONSES)
    model = models["orm"][1]
    for q, r, s in zip(QUESTIONS, RESPONSES, scores, strict=True):
        ids = rm.input_ids(q, r)
        # the AceMath-RM input: the chat template with the response as the assistant turn
        assert rm.tokenizer.decode(ids).startswith("<|im_start|>user\n" + q)
        with torch.no_grad():
            expected = float(model(torch.tensor([ids])).logits[0, 0])
        assert s == pytest.approx(expected, abs=1e-5)
    assert len(set(round(s, 6) for s in scores)) > 1


def test_orm_batching_under_token_budget_keeps_order_and_equals_unbatched(models, monkeypatch):
    rm = _orm(models, max_tokens_per_batch=160)
    calls = _count_batches(monkeypatch, rm)
    batched = rm.score(QUESTIONS, RESPONSES)
    assert len(calls) > 1 and sum(calls) == len(QUESTIONS)
    lengths = [len(rm.input_ids(q, r)) for q, r in zip(QUESTIONS, RESPONSES, strict=True)]
    assert max(lengths) > 0
    one_by_one = [rm.score([q], [r])[0] for q, r in zip(QUESTIONS, RESPONSES, strict=True)]
    assert batched == pytest.approx(one_by_one, abs=1e-5)
    big = _orm(models, max_tokens_per_batch=100_000)
    assert big.score(QUESTIONS[::-1], RESPONSES[::-1]) == pytest.approx(one_by_one[::-1], abs=1e-5)


def test_orm_removes_stop_strings_and_uses_known_system_prompts(models):
    rm = _orm(models, stop=("\nQuestion:",))
    assert rm.score(["q"], ["answer 4\nQuestion: what next"]) == pytest.approx(rm.score(["q"], ["answer 4"]))
    from srd_worker.rewards.hf_orm import default_system

    assert "boxed" in default_system("nvidia/AceMath-7B-RM")
    assert default_system("some/other-rm") is None
    assert rm.system is None  # a local folder named 'orm' gets no system prompt


def test_orm_bad_inputs(models, tmp_path):
    rm = _orm(models)
    with pytest.raises(RewardError, match="2 prompts but 1 responses"):
        rm.score(["a", "b"], ["x"])
    with pytest.raises(RewardError, match="must be text"):
        rm.score(["a"], [None])
    with pytest.raises(RewardError, match="context of 512"):
        rm.score(["q"], ["y" * 600])
    with pytest.raises(RewardError, match="max_tokens_per_batch"):
        _orm(models, max_tokens_per_batch=0)
    from srd_worker.rewards.hf_orm import HFOutcomeReward

    with pytest.raises(RewardError, match="no trained weights for score.weight"):
        HFOutcomeReward(models["causal"][0], device="cpu", dtype="float32")
    with pytest.raises(RewardError, match="cannot load"):
        HFOutcomeReward(str(tmp_path / "nowhere"), device="cpu", dtype="float32")
    with pytest.raises(RewardError, match="unknown dtype"):
        HFOutcomeReward(models["orm"][0], device="cpu", dtype="float8")


# ------------------------------------------------------------------------------------- PRM


def test_split_steps_last_completed_step():
    from srd_worker.rewards.hf_prm import split_steps

    assert split_steps("a\n\nb\n\nc mid", "\n\n") == ["a", "b"]
    assert split_steps("a\n\nb\n\n", "\n\n") == ["a", "b"]
    assert split_steps("a\n\nb", "\n\n", finished=True) == ["a", "b"]
    assert split_steps("a\n\n\n\nb\n\nc", "\n\n") == ["a", "b"]  # blank steps skipped
    assert split_steps("only a partial step", "\n\n") == ["only a partial step"]  # nothing completed yet
    assert split_steps("", "\n\n") == [""]
    assert split_steps("a\nb\nc", "\n") == ["a", "b"]


def test_qwen_prm_scores_last_completed_step(models):
    import torch

    rm = _prm(models, "prm2", "qwen")
    partial = rm.score(["q"], ["step one\n\nstep two\n\nstep three, unfini"])[0]
    assert partial == pytest.approx(rm.score(["q"], ["step one\n\nstep two\n\n"])[0], abs=1e-6)
    assert partial == pytest.approx(rm.score(["q"], ["step one\n\nstep two"], finished=[True])[0], abs=1e-6)
    assert partial != pytest.approx(
        rm.score(["q"], ["step one\n\nstep two\n\nstep three, unfini"], finished=[True])[0], abs=1e-6
    )
    # the score is P(class 1) at the last <extra_0> of the Qwen2.5-Math-PRM input
    ids, pos = rm.input_ids("q", "step one\n\nstep two\n\nstep three")
    text = rm.tokenizer.decode(ids, skip_special_tokens=False)
    assert "step one<extra_0>step two<extra_0>" in text and "step three" not in text
    assert "reason step by step" in text  # the model card's system prompt
    assert ids[pos] == rm.step_token_id and ids.count(rm.step_token_id) == 2
    with torch.no_grad():
        logits = models["prm2"][1](torch.tensor([ids])).logits[0, pos]
    assert partial == pytest.approx(float(torch.softmax(logits, -1)[1]), abs=1e-6)


def test_skywork_prm_scores_last_completed_step(models):
    import torch

    rm = _prm(models, "prm1", "skywork")
    assert rm.step_separator == "\n"
    partial = rm.score(["q"], ["step one\nstep two\nstep thr"])[0]
    assert partial == pytest.approx(rm.score(["q"], ["step one\nstep two\n"])[0], abs=1e-6)
    ids, pos = rm.input_ids("q", "step one\nstep two\nstep thr")
    tok = rm.tokenizer
    expected_ids = (
        tok.encode(tok.bos_token + "q\n", add_special_tokens=False)
        + tok.encode("step one", add_special_tokens=False)
        + [rm.step_token_id]
        + tok.encode("step two", add_special_tokens=False)
        + [rm.step_token_id]
    )
    assert ids == expected_ids and pos == len(ids) - 1
    with torch.no_grad():
        value = models["prm1"][1](torch.tensor([ids])).logits[0, pos, 0]
    assert partial == pytest.approx(float(torch.sigmoid(value)), abs=1e-6)


@pytest.mark.parametrize("kind,style", [("prm2", "qwen"), ("prm1", "skywork")])
def test_prm_batching_under_token_budget_keeps_order_and_equals_unbatched(models, monkeypatch, kind, style):
    rm = _prm(models, kind, style, max_tokens_per_batch=200)
    calls = _count_batches(monkeypatch, rm)
    batched = rm.score(QUESTIONS, RESPONSES)
    assert len(calls) > 1 and sum(calls) == len(QUESTIONS)
    one_by_one = [rm.score([q], [r])[0] for q, r in zip(QUESTIONS, RESPONSES, strict=True)]
    assert batched == pytest.approx(one_by_one, abs=1e-5)
    assert all(0.0 <= s <= 1.0 for s in batched)


def test_released_head_layouts_load(models):
    """Skywork's v_head.summary and Qwen2.5-Math-PRM's two-layer score head are read from the checkpoint."""
    import torch

    sky = _prm(models, "sky_layout", "skywork")
    plain = _prm(models, "prm1", "skywork")
    assert sky.score(QUESTIONS, RESPONSES) == pytest.approx(plain.score(QUESTIONS, RESPONSES), abs=1e-6)
    qwen = _prm(models, "qwen_layout", "qwen")
    assert isinstance(qwen.model.score, torch.nn.Sequential)
    ids, pos = qwen.input_ids(QUESTIONS[0], RESPONSES[0])
    with torch.no_grad():
        logits = models["qwen_layout"][1](torch.tensor([ids])).logits[0, pos]
    assert qwen.score([QUESTIONS[0]], [RESPONSES[0]])[0] == pytest.approx(
        float(torch.softmax(logits, -1)[1]), abs=1e-6
    )


def test_prm_bad_inputs(models):
    from srd_worker.rewards.hf_prm import HFProcessReward

    with pytest.raises(RewardError, match="unknown PRM style"):
        _prm(models, "prm2", "math-shepherd")
    with pytest.raises(RewardError, match="no trained weights"):
        _prm(models, "causal", "skywork")
    with pytest.raises(RewardError, match="no trained weights"):
        _prm(models, "prm1", "qwen")  # a 1-label checkpoint is not a qwen-style PRM
    rm = _prm(models, "prm2", "qwen")
    with pytest.raises(RewardError, match="finished flags"):
        rm.score(["q"], ["a"], finished=[True, False])
    with pytest.raises(RewardError, match="context of 512"):
        rm.score(["q"], ["y" * 600 + "\n\n"])
    with pytest.raises(RewardError, match="step_separator"):
        HFProcessReward(models["prm2"][0], style="qwen", device="cpu", dtype="float32", step_separator="")
    with pytest.raises(RewardError, match="as one token"):
        HFProcessReward(models["prm2"][0], style="qwen", device="cpu", dtype="float32", step_token="<step>")


# ------------------------------------------------------------------------------------- registry


def test_reward_names_validate_by_prefix_only():
    from srd_worker.rewards.hf_prm import STYLES
    from srd_worker.rewards.registry import PRM_STYLES, check_reward_name, parse_reward_name

    assert PRM_STYLES == STYLES

    assert parse_reward_name("hf-orm:nvidia/AceMath-7B-RM") == ("hf-orm", "nvidia/AceMath-7B-RM", None)
    assert parse_reward_name("hf-prm:Skywork/Skywork-o1-Open-PRM-Qwen-2.5-7B")[2] == "skywork"
    assert parse_reward_name("hf-prm:Qwen/Qwen2.5-Math-PRM-7B") == (
        "hf-prm",
        "Qwen/Qwen2.5-Math-PRM-7B",
        "qwen",
    )
    assert parse_reward_name("hf-prm:some/prm:skywork") == ("hf-prm", "some/prm", "skywork")
    assert parse_reward_name("vllm-rm:nvidia/AceMath-7B-RM")[0] == "vllm-rm"
    for ok in ("arithmetic", "lm_judge", "none", "hf-orm:does/not-exist"):
        check_reward_name(ok)
    for bad, msg in [
        ("hf-orm:", "names no model"),
        ("hf-prm:a/b:fancy", "unknown PRM style"),
        ("orm:x", "unknown reward"),
        ("hf-orm:a:b", "must not contain"),
        ("oracle", "arithmetic"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            check_reward_name(bad)


def test_build_reward_loads_checkpoints_once_per_process(models):
    from srd_worker.rewards.hf_orm import HFOutcomeReward
    from srd_worker.rewards.hf_prm import HFProcessReward
    from srd_worker.rewards.registry import build_reward
    from srd_worker.settings import Settings

    settings = Settings(device="cpu", dtype="float32")
    orm = build_reward(f"hf-orm:{models['orm'][0]}", None, settings=settings)
    assert isinstance(orm, HFOutcomeReward) and orm.name == f"hf-orm:{models['orm'][0]}"
    assert build_reward(f"hf-orm:{models['orm'][0]}", None, settings=settings) is orm
    prm = build_reward(f"hf-prm:{models['prm1'][0]}:skywork", None, settings=settings)
    assert isinstance(prm, HFProcessReward) and prm.style == "skywork"
    assert len(orm.score(QUESTIONS[:2], RESPONSES[:2])) == 2


@pytest.mark.parametrize("kind", ["orm", "prm"])
def test_cudnn_attention_setting_reaches_an_hf_reward_built_without_the_engine(models, kind):
    """A fleet may pair a vLLM policy with an HF reward model: SRDQ_CUDNN_ATTENTION=false turns PyTorch's
    cuDNN attention off when the reward loads (also after the same reward was built with it on), as it does
    for the transformers engine."""
    import torch

    from srd_worker.rewards.registry import build_reward
    from srd_worker.settings import Settings

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        name = f"hf-orm:{models['orm'][0]}" if kind == "orm" else f"hf-prm:{models['prm1'][0]}:skywork"
        build_reward(name, None, settings=Settings(device="cpu", dtype="float32"))
        assert torch.backends.cuda.cudnn_sdp_enabled()
        settings = Settings(device="cpu", dtype="float32", cudnn_attention=False)
        assert len(build_reward(name, None, settings=settings).score(QUESTIONS[:1], RESPONSES[:1])) == 1
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
