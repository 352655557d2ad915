"""∇-Reasoner (``nabla_reasoner``, ALGORITHMS.md §8) on real transformers models built here.

Policy: the tiny random Llama of ``build_tiny_llama`` (fp32). Reward: a tiny random
``LlamaForSequenceClassification`` over the SAME tokenizer (so the soft tokens need no alignment), wrapped
by the hf-orm adapter. Checked: the DTO loss decreases; gradient caching takes the same steps (and picks
the same token) as recomputing every gradient while the argmax does not change; a rejected proposal keeps
the old rollout; runs are reproducible under a seed and a run resumed from a mid-run checkpoint ends
identically; the §8.6 counters add up; soft scores equal the hard scores at one-hot inputs (hf-orm,
hf-prm, lm_judge); the arithmetic reward and the vLLM engine are refused; ``srdq run`` on the testbed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from srd_worker.errors import CapabilityError
from srd_worker.methods.base import StepContext
from srd_worker.methods.nabla_reasoner import COUNTERS, DTOProblem, straight_through
from srd_worker.methods.registry import build_method

ROOT = Path(__file__).resolve().parents[3]
QUESTIONS = ["What is 3 + 4?", "Compute 6 * 7."]
#: small enough for two cores; grad_norm_threshold 0 and no confidence filter: every iteration optimises
PARAMS = {
    "max_new_tokens": 10,
    "max_iters": 3,
    "lr": 0.5,
    "grad_norm_threshold": 0.0,
    "confidence_threshold": None,
    "max_generations": 4,
}


@pytest.fixture(scope="module")
def reward(tiny_engine):
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from srd_worker.rewards.hf_orm import HFOutcomeReward

    tok = tiny_engine.tokenizer.hf
    cfg = LlamaConfig(
        vocab_size=tiny_engine.model.config.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
        initializer_range=0.2,
    )
    with torch.random.fork_rng():
        torch.manual_seed(1)
        rm = LlamaForSequenceClassification(cfg).float().eval()
    return HFOutcomeReward("tiny-rm", model=rm, tokenizer=tok)


def _prompt(engine, q: str) -> list[int]:
    return engine.tokenizer.chat_prompt_ids([{"role": "user", "content": q}])


def _run(engine, reward, *, seed=0, states=None, params=PARAMS, trace=None, max_rounds=60):
    method = build_method("nabla_reasoner", params)
    ctx = StepContext(engine, reward, seed)
    if states is None:
        states = [method.init_state(f"q{i}", q, _prompt(engine, q)) for i, q in enumerate(QUESTIONS)]
    snapshots = []
    for _ in range(max_rounds):
        active = [s for s in states if not method.done(s)]
        if not active:
            return method, states, snapshots
        before = [(s["past"] + s["ahead"], len(s["past"]), dict(s["stats"])) for s in active]
        method.step(active, ctx)
        if trace is not None:
            trace.extend(
                zip(
                    before,
                    [(s["past"] + s["ahead"], len(s["past"]), dict(s["stats"])) for s in active],
                    strict=True,
                )
            )
        snapshots.append(json.dumps(states))
    raise AssertionError("nabla_reasoner did not finish")


@pytest.fixture(scope="module")
def run(tiny_engine, reward):
    trace: list[Any] = []
    method, states, snapshots = _run(tiny_engine, reward, trace=trace)
    return method, states, snapshots, trace


def _problem(engine, reward, **overrides):
    from srd_worker.methods.nabla_reasoner import NablaReasonerParams

    prompt = _prompt(engine, QUESTIONS[0])
    ahead = engine.tokenizer.encode("3 + 4 = 7")
    grads = engine.gradients
    z = grads.teacher_forced_logits(prompt, ahead)
    p = NablaReasonerParams.from_dict({**PARAMS, **overrides})
    stats = {k: 0 for k in COUNTERS}
    return DTOProblem(grads, reward, QUESTIONS[0], prompt, "", p, stats), z


# ------------------------------------------------------------------------------------- the DTO


def test_straight_through_is_one_hot_forward_with_softmax_gradient():
    import torch

    z = torch.tensor([[0.1, 2.0, -1.0]], requires_grad=True)
    y = straight_through(z, 1.0, True)
    assert y.tolist() == [[0.0, 1.0, 0.0]]
    (g,) = torch.autograd.grad((y * torch.tensor([[1.0, 2.0, 3.0]])).sum(), z)
    s = torch.softmax(z.detach(), -1)
    expected = s * (torch.tensor([[1.0, 2.0, 3.0]]) - (s * torch.tensor([[1.0, 2.0, 3.0]])).sum())
    assert torch.allclose(g, expected, atol=1e-6)


def test_cosine_schedule_is_clipped_at_the_floor_as_in_the_reference_code():
    """``lr_schedule=clip`` (the default): max(min_ratio, ½(1 + cos(πk/T))), worked by hand at T = 20:
    k = 10 is the half-way 0.5, k = 15 is ½(1 − √2/2) = 0.1464, from k = 16 (0.0955 unclipped) the floor
    0.1; ``rescale`` squeezes the cosine into [0.1, 1] instead (k = 10: 0.1 + 0.9·0.5 = 0.55)."""
    import math

    from srd_worker.methods.nabla_reasoner import cosine_factor

    clip = [cosine_factor(k, 20, 0.1) for k in range(21)]
    assert clip[0] == 1.0
    assert math.isclose(clip[10], 0.5)
    assert math.isclose(clip[15], 0.5 * (1 - math.sqrt(2) / 2))
    assert clip[16:] == [0.1] * 5
    rescale = [cosine_factor(k, 20, 0.1, "rescale") for k in range(21)]
    assert rescale[0] == 1.0 and math.isclose(rescale[10], 0.55) and math.isclose(rescale[20], 0.1)
    assert math.isclose(rescale[16], 0.1 + 0.9 * 0.5 * (1 + math.cos(0.8 * math.pi)))
    # the 20 steps' factors: Σ ½(1 + cos(πk/20)) = 10.5 (the cosines cancel in pairs but for k = 0), and
    # the clip lifts k = 16…19 from Σ ½(1 + cos(πk/20)) to 0.4
    lifted = 0.4 - sum(0.5 * (1 + math.cos(math.pi * k / 20)) for k in range(16, 20))
    assert math.isclose(sum(clip[:20]), 10.5 + lifted) and math.isclose(lifted, 0.2194, abs_tol=1e-4)


@pytest.mark.parametrize("schedule", ["clip", "rescale"])
def test_the_dto_optimiser_steps_by_the_chosen_schedule(tiny_engine, reward, monkeypatch, schedule):
    """Every DTO step's learning rate is ``lr·cosine_factor(k, max_iters, min_lr_ratio, lr_schedule)``:
    read off the optimiser before each step."""
    import torch

    from srd_worker.methods import nabla_reasoner as nr

    rates: list[float] = []
    real_step = torch.optim.Adam.step

    def step(self, *args, **kwargs):
        rates.append(self.param_groups[0]["lr"])
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", step)
    problem, z = _problem(tiny_engine, reward, max_iters=6, lr=0.2, lr_schedule=schedule)
    problem.optimise(z)
    expected = [0.2 * nr.cosine_factor(k, 6, 0.1, schedule) for k in range(6)]
    assert rates == pytest.approx(expected)
    assert (rates[-1] == pytest.approx(0.2 * 0.1)) == (schedule == "clip")


def test_unknown_lr_schedule_is_refused():
    from srd_worker.errors import ConfigError
    from srd_worker.methods.nabla_reasoner import NablaReasonerParams

    with pytest.raises(ConfigError, match="lr_schedule must be one of clip, rescale"):
        NablaReasonerParams.from_dict({"lr_schedule": "linear"}).validate()


def test_dto_loss_decreases_over_iterations(tiny_engine, reward):
    """The relaxed loss L(softmax(Z)) (no straight-through, a full gradient every step) decreases: the
    gradients through the policy and the reward model point downhill."""
    problem, z = _problem(
        tiny_engine, reward, straight_through=False, grad_caching=False, max_iters=8, lr=0.1
    )
    res = problem.optimise(z)
    assert res.full_steps == 8 and res.cached_steps == 0
    assert res.losses[-1] < res.losses[0]
    downhill = sum(b <= a + 1e-6 for a, b in zip(res.losses, res.losses[1:], strict=False))
    assert downhill >= len(res.losses) - 2, res.losses
    assert problem.stats["lm_backward_passes"] == problem.stats["rm_backward_passes"] == 8


def test_gradient_caching_matches_full_recomputation_while_the_argmax_holds(tiny_engine, reward):
    """With a straight-through forward the model sees the same one-hot input until the argmax changes, so
    the cached gradient IS the full one: the two runs take the same steps and end on the same token."""
    import torch

    from srd_worker.methods.nabla_reasoner import sample_token

    kw = {"max_iters": 5, "lr": 0.01}
    cached, z = _problem(tiny_engine, reward, grad_caching=True, **kw)
    full, _ = _problem(tiny_engine, reward, grad_caching=False, **kw)
    a, b = cached.optimise(z), full.optimise(z)
    first = int(z[0].argmax())
    assert a.tokens == b.tokens == [first] * 5  # the argmax never changed (the premise)
    assert (a.full_steps, a.cached_steps, b.full_steps) == (1, 4, 5)
    assert torch.allclose(a.logits, b.logits, atol=1e-5)
    assert sample_token(a.logits, 0.5, 0.95, 0, 7) == sample_token(b.logits, 0.5, 0.95, 0, 7)


def test_caching_recomputes_when_the_argmax_changes(tiny_engine, reward):
    problem, z = _problem(tiny_engine, reward, grad_caching=True, max_iters=8, lr=2.0)
    res = problem.optimise(z)
    changes = sum(x != y for x, y in zip([int(z[0].argmax())] + res.tokens, res.tokens, strict=False))
    assert changes >= 1, "lr 2.0 should move the argmax"
    assert res.full_steps == 1 + sum(
        x != y for x, y in zip([int(z[0].argmax())] + res.tokens[:-1], res.tokens[:-1], strict=False)
    )


def test_latents_embedder_optimises_hidden_states_through_the_output_head(tiny_engine, reward):
    import torch

    grads = tiny_engine.gradients
    prompt = _prompt(tiny_engine, QUESTIONS[0])
    ahead = tiny_engine.tokenizer.encode("3 + 4 = 7")
    hidden = grads.teacher_forced_hidden(prompt, ahead)
    assert torch.allclose(grads.project(hidden), grads.teacher_forced_logits(prompt, ahead), atol=1e-4)
    problem, _ = _problem(tiny_engine, reward, embedder="latents", max_iters=4, lr=0.5)
    res = problem.optimise(hidden)
    assert res.full_steps >= 1 and res.logits.shape == (grads.vocab_size,)
    assert not torch.allclose(res.logits, grads.project(hidden)[0])  # the hidden state moved


# ------------------------------------------------------------------------------------- the loop


def test_rejected_proposal_keeps_the_old_rollout(run):
    _, _, _, trace = run
    rejections = accepts = 0
    for (seq0, past0, st0), (seq1, past1, st1) in trace:
        if st1["n_rejections"] > st0["n_rejections"]:
            rejections += 1
            assert seq1 == seq0  # the same rollout: committed and ahead tokens unchanged
            assert past1 > past0  # the old token (and what selection skipped) committed
        elif st1["n_acceptance_checks"] > st0["n_acceptance_checks"]:
            accepts += 1
            assert seq1 != seq0 and seq1[:past0] == seq0[:past0]
    assert rejections >= 1 and accepts >= 1, (rejections, accepts)


def test_counters_add_up(run, tiny_engine):
    method, states, _, _ = run
    for s in states:
        res = method.result(s)
        assert res["response"] == tiny_engine.tokenizer.decode(s["past"])
        assert res["finish_reason"] in ("eos", "length") and isinstance(res["reward"], float)
        for key in COUNTERS:
            assert isinstance(res[key], int), key
        assert res["num_llm_calls"] == (
            res["n_generated_tokens"] + 4 * res["num_grad_steps"] + 2 * res["n_acceptance_checks"]
        )
        assert 1 <= res["n_generations"] <= PARAMS["max_generations"]
        assert res["n_generated_tokens"] == s["ledger"]["gen_tokens"]
        assert res["n_probe_passes"] == res["n_iterations"] >= res["n_dto_calls"] >= 1
        assert res["n_rejections"] <= res["n_acceptance_checks"] <= res["n_revisions"]
        assert res["n_generations"] - 1 <= res["n_acceptance_checks"]
        assert res["lm_backward_passes"] == res["num_grad_steps"] + res["n_probe_passes"]
        assert res["n_response_tokens"] <= PARAMS["max_new_tokens"]


def test_reproducible_under_a_seed(run, tiny_engine, reward):
    method, states, _, _ = run
    again_method, again, _ = _run(tiny_engine, reward)
    assert [again_method.result(s) for s in again] == [method.result(s) for s in states]


def test_resume_from_a_checkpoint_is_identical(run, tiny_engine, reward):
    """A fresh method instance (empty caches, as after a crash) continues from the JSON checkpoint of a
    mid-run round and ends with the same states and results."""
    method, states, snapshots, _ = run
    assert len(snapshots) >= 3
    resumed_method, resumed, _ = _run(tiny_engine, reward, states=json.loads(snapshots[1]))
    strip = lambda s: {k: v for k, v in s.items() if k != "timing"}  # noqa: E731
    assert [strip(s) for s in resumed] == [strip(s) for s in states]
    assert [resumed_method.result(s) for s in resumed] == [method.result(s) for s in states]


# ------------------------------------------------------------------------------------- soft scores


def _one_hot(engine, text: str):
    import torch

    ids = engine.tokenizer.encode(text)
    return torch.nn.functional.one_hot(torch.tensor(ids), engine.gradients.vocab_size).float()


def test_orm_soft_score_equals_score_at_one_hot(tiny_engine, reward):
    vocab = tiny_engine.gradients.vocab_tokens()
    y = _one_hot(tiny_engine, " so 7.")
    soft = reward.soft_score(QUESTIONS[0], "3 + 4 = 7", y.requires_grad_(True), vocab)
    assert abs(float(soft.detach()) - reward.score([QUESTIONS[0]], ["3 + 4 = 7 so 7."])[0]) < 1e-4
    assert reward.vocab_overlap(vocab) == 1.0
    import torch

    (g,) = torch.autograd.grad(soft, y)
    assert float(g.abs().sum()) > 0


def test_prm_and_judge_soft_scores_equal_their_scores_at_one_hot(tiny_engine, tmp_path):
    import torch
    from transformers import LlamaConfig, LlamaForTokenClassification

    from srd_worker.rewards.hf_prm import HFProcessReward
    from srd_worker.rewards.lm_judge import LMJudgeReward

    tok = tiny_engine.tokenizer.hf
    vocab = tiny_engine.gradients.vocab_tokens()
    cfg = LlamaConfig(
        vocab_size=tiny_engine.model.config.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(2)
        LlamaForTokenClassification(cfg).save_pretrained(tmp_path / "prm")
    tok.save_pretrained(tmp_path / "prm")
    prm = HFProcessReward(str(tmp_path / "prm"), style="skywork", device="cpu", dtype="float32")
    y = _one_hot(tiny_engine, " is 7")
    # one step (no separator): the soft layout is the score's layout for a finished response
    soft = prm.soft_score(QUESTIONS[0], "3 + 4", y, vocab)
    hard = prm.score([QUESTIONS[0]], ["3 + 4 is 7"], finished=[True])[0]
    assert abs(float(soft.detach()) - hard) < 1e-5
    judge = LMJudgeReward(tiny_engine)
    soft = judge.soft_score(QUESTIONS[0], "3 + 4", y, vocab)
    assert abs(float(soft.detach()) - judge.score([QUESTIONS[0]], ["3 + 4 is 7"])[0]) < 1e-4
    assert judge.can_differentiate and judge.vocab_overlap(vocab) == 1.0


def test_vocabulary_alignment_by_token_string(reward):
    """A policy vocabulary in another order, with two tokens the reward model lacks: each row is the
    reward's embedding of the same string, zero for the unknown ones, and the overlap says so."""
    import torch

    from srd_worker.rewards.hf_common import SoftEmbedder

    emb = SoftEmbedder(reward.model, reward.tokenizer)
    own = emb._own_vocab()
    policy = list(reversed(own)) + ["<not-a-token-1>", "<not-a-token-2>"]
    matrix, overlap = emb.aligned(policy)
    w = reward.model.get_input_embeddings().weight
    assert matrix.shape == (len(policy), w.shape[1])
    assert torch.equal(matrix[0], w[len(own) - 1]) and torch.equal(matrix[len(own) - 1], w[0])
    assert float(matrix[-2:].abs().sum()) == 0.0
    assert overlap == pytest.approx(len(own) / len(policy))
    assert emb.aligned(own)[0] is w  # identical vocabularies: the matrix as it is


def test_refused_when_the_reward_vocabulary_covers_too_little(tiny_engine, reward, monkeypatch):
    from srd_worker.errors import ConfigError

    monkeypatch.setattr(type(reward), "vocab_overlap", lambda self, vocab: 0.5)
    method = build_method("nabla_reasoner", PARAMS)
    state = method.init_state("q", QUESTIONS[0], _prompt(tiny_engine, QUESTIONS[0]))
    with pytest.raises(
        ConfigError, match=r"counterpart for 50\.0% of the policy's tokens.*min_vocab_overlap=0\.9"
    ):
        method.step([state], StepContext(tiny_engine, reward, 0))


def test_qwen_prm_with_its_own_step_token_aligns_and_matches_at_one_hot(tiny_engine, tmp_path):
    """A qwen-style PRM whose tokenizer adds ``<extra_0>`` (so its vocabulary is not the policy's): the
    soft rows go through the token-string alignment, and a one-step response scores as ``score`` does."""
    import torch
    from transformers import LlamaConfig, LlamaForTokenClassification

    from srd_worker.engines.loading import build_tiny_llama
    from srd_worker.rewards.hf_prm import HFProcessReward

    _, tok = build_tiny_llama()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<extra_0>"]})
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=2,
        pad_token_id=tok.pad_token_id,
        initializer_range=0.2,
    )
    with torch.random.fork_rng():
        torch.manual_seed(3)
        LlamaForTokenClassification(cfg).save_pretrained(tmp_path / "qprm")
    tok.save_pretrained(tmp_path / "qprm")
    prm = HFProcessReward(str(tmp_path / "qprm"), style="qwen", device="cpu", dtype="float32")
    vocab = tiny_engine.gradients.vocab_tokens()
    assert prm.vocab_overlap(vocab) == 1.0 and len(vocab) < len(tok)
    y = _one_hot(tiny_engine, " is 7")
    soft = prm.soft_score(QUESTIONS[0], "3 + 4", y, vocab)
    hard = prm.score([QUESTIONS[0]], ["3 + 4 is 7"], finished=[True])[0]
    assert abs(float(soft.detach()) - hard) < 1e-5


# ------------------------------------------------------------------------------------- refusals


def test_refused_with_the_arithmetic_reward_and_the_vllm_engine(tmp_path, tiny_engine):
    from srd_worker.rewards.arithmetic import ArithmeticReward
    from srd_worker.spec import prepare_run

    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "What is 1+1?", "answer": "1+1=2\\n#### 2"}\n', encoding="utf-8")
    kw = dict(dataset=data, method="nabla_reasoner", params={}, model="testbed")
    with pytest.raises(
        CapabilityError, match="needs a differentiable reward.*'arithmetic' gives no gradient"
    ):
        prepare_run(reward="arithmetic", **kw)
    with pytest.raises(CapabilityError, match="gradients.*'vllm' engine"):
        prepare_run(reward="hf-orm:x", engine="vllm", **kw)
    assert prepare_run(reward="lm_judge", **kw).spec.method == "nabla_reasoner"
    # at run time too, whatever built the reward
    method = build_method("nabla_reasoner", PARAMS)
    state = method.init_state("q", QUESTIONS[0], _prompt(tiny_engine, QUESTIONS[0]))
    with pytest.raises(CapabilityError, match="differentiable reward.*'arithmetic'"):
        method.step([state], StepContext(tiny_engine, ArithmeticReward(), 0))


def test_cli_refuses_before_writing_anything(tmp_path):
    from tests.cli import run_srdq

    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "What is 1+1?", "answer": "1+1=2\\n#### 2"}\n', encoding="utf-8")
    out = tmp_path / "out"
    proc = run_srdq(
        "run", str(data), "--method", "nabla_reasoner", "--reward", "arithmetic", "--out", str(out)
    )
    assert proc.returncode != 0 and "differentiable reward" in proc.stderr + proc.stdout
    assert not out.exists()


def test_submit_dataset_dry_run_accepts_a_differentiable_reward_and_refuses_arithmetic(tmp_path):
    from click.testing import CliRunner
    from srdq_cli.main import cli

    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "What is 1+1?", "answer": "1+1=2\\n#### 2"}\n', encoding="utf-8")
    base = ["submit", "dataset", str(data), "--method", "nabla_reasoner", "--model", "testbed", "--dry-run"]
    ok = CliRunner().invoke(cli, [*base, "--reward", "hf-orm:srd_worker/testbed/artifacts/rm"])
    assert ok.exit_code == 0 and "dry run, nothing stored" in ok.output, ok.output
    bad = CliRunner().invoke(cli, [*base, "--reward", "arithmetic"])
    assert bad.exit_code != 0 and "differentiable reward" in bad.output
    vllm = CliRunner().invoke(cli, [*base, "--reward", "lm_judge", "--engine", "vllm"])
    assert vllm.exit_code != 0 and "gradients" in vllm.output


# ------------------------------------------------------------------------------------- srdq run


TESTBED_ARGS = [
    "--model",
    "testbed",
    "--method",
    "nabla_reasoner",
    "--reward",
    "hf-orm:srd_worker/testbed/artifacts/rm",
    "--limit",
    "2",
    "--max-new-tokens",
    "40",
    "--set",
    "max_iters=4",
    "--set",
    "grad_norm_threshold=0.5",
    "--set",
    "confidence_threshold=0.9",
]


def _testbed_run(out: Path, **env: str):
    from tests.cli import run_srdq, srdq_env

    data = ROOT / "srd_worker/testbed/artifacts/data/test.jsonl"
    return run_srdq(
        "run",
        str(data),
        *TESTBED_ARGS,
        "--out",
        str(out),
        cwd=ROOT,
        env=srdq_env(SRDQ_DTYPE="float32", SRDQ_DEVICE="cpu", SRDQ_KV_REUSE="false", **env),
        timeout=300,
    )


@pytest.fixture(scope="module")
def testbed_results(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("testbed")
    proc = _testbed_run(out)
    assert proc.returncode == 0, proc.stderr
    (results,) = out.glob("run-*/results.jsonl")
    return results


@pytest.mark.slow
def test_srdq_run_on_the_testbed(testbed_results):
    rows = [json.loads(line) for line in testbed_results.read_text().splitlines()]
    assert len(rows) == 2
    for r in rows:
        assert r["method"] == "nabla_reasoner" and r["error"] is None and r["response"]
        assert isinstance(r["correct"], bool) and isinstance(r["reward"], float)
        assert set(COUNTERS) <= set(r["extra"])
        assert r["extra"]["n_generated_tokens"] == r["ledger"]["gen_tokens"] > 0
    assert sum(r["extra"]["n_dto_calls"] for r in rows) >= 1


@pytest.mark.slow
def test_counters_reach_export_and_report(testbed_results, tmp_path):
    import csv

    from tests.cli import run_srdq

    out = testbed_results.parent.parent
    run_id = testbed_results.parent.name
    exported = tmp_path / "nabla.csv"
    proc = run_srdq("export", run_id, "--format", "csv", "--out", str(exported), "--db", str(out))
    assert proc.returncode == 0, proc.stderr
    with exported.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2
    for name in COUNTERS:
        assert f"extra.{name}" in rows[0], name
    assert [int(r["extra.n_generated_tokens"]) for r in rows] == [
        json.loads(line)["extra"]["n_generated_tokens"] for line in testbed_results.read_text().splitlines()
    ]
    proc = run_srdq("report", run_id, "--out", str(tmp_path / "report"), "--db", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "nabla_reasoner" in (tmp_path / "report" / "report.md").read_text(encoding="utf-8")


@pytest.mark.slow
def test_srdq_run_killed_and_resumed_is_byte_identical(tmp_path, testbed_results):
    out = tmp_path / "out"
    crashed = _testbed_run(out, SRDQ_CRASH_AFTER_ROUND="2")
    assert crashed.returncode == 86, crashed.stderr
    assert not list(out.glob("run-*/results.jsonl"))
    resumed = _testbed_run(out)
    assert resumed.returncode == 0, resumed.stderr
    (results,) = out.glob("run-*/results.jsonl")
    strip = lambda text: [  # noqa: E731
        {k: v for k, v in json.loads(line).items() if k != "timing"} for line in text.splitlines()
    ]
    assert strip(results.read_text()) == strip(testbed_results.read_text())
