"""The ``vllm-rm`` reward on a real small sequence-classification model: a random-weight
LlamaForSequenceClassification (one label) built here and saved with ``save_pretrained``; vLLM's pooled
last-token score must agree with transformers' logit on the same token ids (up to vLLM's activation)."""

from __future__ import annotations

import math

import psutil
import pytest


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from srd_worker.engines.loading import build_tiny_llama

    _, tokenizer = build_tiny_llama(seed=0, hidden_size=256)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
    )
    model = LlamaForSequenceClassification(cfg).eval()
    path = tmp_path_factory.mktemp("rm") / "tiny-rm"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, model


def test_vllm_rm_scores_like_transformers_and_closes(rm_dir):
    import torch

    from srd_worker.rewards.vllm_reward import VLLMReward

    path, model = rm_dir
    rm = VLLMReward(str(path), dtype="float32", enforce_eager=True, max_model_len=1024, system=None)
    try:
        started = set(rm._procs.children)
        questions = ["What is 2+3?", "What is 2+3?", "Name a duck."]
        answers = ["2+3=5. The answer is 5.", "It is 7", "Donald"]
        got = rm.score(questions, answers)
        assert len(got) == 3 and all(math.isfinite(x) for x in got)
        with torch.no_grad():
            want = [
                float(model(torch.tensor([rm.input_ids(q, a)])).logits[0, 0])
                for q, a in zip(questions, answers, strict=True)
            ]
        raw = all(math.isclose(g, w, abs_tol=1e-3) for g, w in zip(got, want, strict=True))
        sig = all(
            math.isclose(g, 1 / (1 + math.exp(-w)), abs_tol=1e-3) for g, w in zip(got, want, strict=True)
        )
        assert raw or sig, (got, want)
        # the same pairs in another order and batch score the same
        assert rm.score(questions[::-1], answers[::-1]) == pytest.approx(got[::-1], abs=1e-4)
    finally:
        rm.close()
    assert not [
        p for p in started if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]
