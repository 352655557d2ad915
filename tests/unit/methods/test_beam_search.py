"""Beam search and DVTS (ALGORITHMS.md §8) on real models: the tiny random Llama with a scripted reward
whose scores are a known function of the text, and the trained testbed policy with its step delimiter.

The expectations (which beams are kept, which expansion a subtree picks) are computed here from the
scripted reward's scores, not with the methods' own helpers.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from srd_worker.errors import ConfigError
from srd_worker.methods.base import StepContext
from srd_worker.methods.registry import build_method
from srd_worker.methods.step_search import unescape, weighted_majority
from srd_worker.runner import run_shard
from srd_worker.tasks.base import Item
from srd_worker.tasks.gsm8k import GSM8KTask
from srd_worker.votes import whitespace_classes
from tests.doubles import MemoryStore

QUESTIONS = ["What is 3 + 4?", "Tom has 5 apples and eats 2. How many are left?"]
TESTBED = Path(__file__).resolve().parents[3] / "srd_worker" / "testbed" / "artifacts"


def scripted(text: str) -> float:
    """The scripted reward: a fixed pseudo-random number in [0, 1) per text."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big") / 2**32


class ScriptedReward:
    """A real RewardModel whose score is ``scripted(response)``; it records every batch it scores."""

    name = "scripted"

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def score(self, prompts, responses, finished=None):
        self.batches.append(list(responses))
        return [scripted(r) for r in responses]


def by_hand(scores: list[float], how: str) -> float:
    if how == "last":
        return scores[-1]
    if how == "min":
        return min(scores)
    out = 1.0
    for s in scores:
        out *= s
    return out


def start(method, engine, questions=QUESTIONS):
    return [
        method.init_state(f"q{i}", q, engine.tokenizer.chat_prompt_ids([{"role": "user", "content": q}]))
        for i, q in enumerate(questions)
    ]


def is_prefix(a: list[int], b: list[int]) -> bool:
    return b[: len(a)] == a


@pytest.mark.parametrize("how", ["last", "min", "prod"])
def test_beam_search_keeps_exactly_the_top_beams(tiny_engine, how):
    n, m = 6, 2
    method = build_method(
        "beam_search",
        {
            "n": n,
            "beam_width": m,
            "chunk_tokens": 3,
            "max_new_tokens": 12,
            "aggregation": how,
            "max_steps": 8,
        },
    )
    reward = ScriptedReward()
    ctx = StepContext(tiny_engine, reward, run_seed=3)
    states = start(method, tiny_engine)
    history: dict[str, list[list[float]]] = {s["item_id"]: [] for s in states}  # per beam slot
    previous: dict[str, list[dict[str, Any]]] = {s["item_id"]: [] for s in states}
    steps_checked = 0
    while not all(method.done(s) for s in states):
        active = [s for s in states if not method.done(s)]
        rm_before = {s["item_id"]: s["ledger"]["rm_calls"] for s in active}
        method.step(active, ctx)
        for s in active:
            beams, prev = s["beams"], previous[s["item_id"]]
            assert len(beams) == n
            assert s["ledger"]["rm_calls"] - rm_before[s["item_id"]] == n  # one score per expansion
            kept_before = [i for i, b in enumerate(prev) if b["kept"]]
            scores: list[list[float]] = []
            for slot, b in enumerate(beams):
                if not prev:
                    assert b["parent"] == -1
                    parent_scores: list[float] = []
                else:
                    # the n expansions are dealt round-robin over the kept beams: M each when n/M are kept
                    assert b["parent"] == kept_before[slot % len(kept_before)]
                    assert is_prefix(prev[b["parent"]]["tokens"], b["tokens"])
                    assert len(b["tokens"]) > len(prev[b["parent"]]["tokens"])
                    parent_scores = history[s["item_id"]][b["parent"]]
                scores.append(parent_scores + [scripted(b["text"])])
            agg = [by_hand(sc, how) for sc in scores]
            unfinished = [i for i, b in enumerate(beams) if b["finish"] is None]
            expected = sorted(unfinished, key=lambda i: (-agg[i], i))[: n // m]
            assert sorted(i for i, b in enumerate(beams) if b["kept"]) == sorted(expected)
            assert [b["reward"] for b in beams] == pytest.approx(agg)
            history[s["item_id"]] = scores
            previous[s["item_id"]] = copy.deepcopy(beams)
            steps_checked += bool(expected)
            json.dumps(s)
    assert steps_checked >= 4  # several selections, not only the first step
    for s in states:
        res = method.result(s)
        assert len(s["pool"]) == n and all(e["finish"] for e in s["pool"])
        best = max(e["reward"] for e in s["pool"])
        assert res["reward"] == best and res["response"] == s["pool"][res["chosen"]]["text"]
        assert s["ledger"]["gen_tokens"] == s["ledger"]["components"]["drafter"]["out_tokens"]


def test_dvts_subtrees_never_share_a_prefix_after_the_first_step(tiny_engine):
    n, m = 6, 2
    method = build_method("dvts", {"n": n, "beam_width": m, "chunk_tokens": 3, "max_new_tokens": 12})
    reward = ScriptedReward()
    ctx = StepContext(tiny_engine, reward, run_seed=5)
    states = start(method, tiny_engine)
    chosen_before: dict[str, dict[int, list[int]]] = {s["item_id"]: {} for s in states}
    rounds = 0
    while not all(method.done(s) for s in states):
        active = [s for s in states if not method.done(s)]
        method.step(active, ctx)
        rounds += 1
        for s in active:
            chosen: dict[int, list[int]] = {}
            for j in range(n // m):
                group = s["beams"][j * m : (j + 1) * m]
                assert {b["subtree"] for b in group} == {j}
                # the subtree's beam is its best expansion by the scripted reward (ties: lower slot)
                best = max(range(m), key=lambda i: (scripted(group[i]["text"]), -i))
                assert [b["kept"] for b in group] == [i == best for i in range(m)]
                chosen[j] = group[best]["tokens"]
                if j in chosen_before[s["item_id"]]:  # every expansion continues the subtree's own beam
                    assert all(is_prefix(chosen_before[s["item_id"]][j], b["tokens"]) for b in group)
            for j in chosen:
                for k in chosen:
                    if j != k:
                        assert not is_prefix(chosen[j], chosen[k]), (j, k)
            chosen_before[s["item_id"]] = chosen
    assert rounds >= 3
    for s in states:
        assert s["pool"] and all(e["finish"] for e in s["pool"])
        assert len(s["pool"]) <= n


@pytest.mark.parametrize("name", ["beam_search", "dvts"])
def test_crash_and_resume_give_identical_results(tiny_engine, name):
    params = {"n": 4, "beam_width": 2, "chunk_tokens": 4, "max_new_tokens": 16, "answer": "weighted_majority"}
    task = GSM8KTask()
    items = [Item(f"q{i}", q, "7") for i, q in enumerate(QUESTIONS)]

    def run(store, max_rounds=None):
        return run_shard(
            items=items,
            positions=list(range(len(items))),
            method=build_method(name, params),
            task=task,
            engine=tiny_engine,
            reward=ScriptedReward(),
            run_seed=11,
            store=store,
            max_rounds=max_rounds,
        )

    clean = MemoryStore()
    uninterrupted = run(clean)
    assert uninterrupted.finished and uninterrupted.rounds > 2
    crashed = MemoryStore()
    assert not run(crashed, max_rounds=2).finished  # "crash" after round 2: only the checkpoints remain
    resumed = run(crashed)
    assert resumed.finished and resumed.rounds == uninterrupted.rounds

    def strip(records):
        return [{k: v for k, v in r.items() if k != "timing"} for r in records]

    assert clean.results is not None and crashed.results is not None
    assert strip(crashed.results) == strip(clean.results)
    for rec in clean.results:
        assert rec["error"] is None and rec["candidates"]
        assert rec["response"] == rec["candidates"][rec["extra"]["chosen"]]["text"]
        assert rec["ledger"]["rm_calls"] > 0 and rec["ledger"]["gen_tokens"] > 0


def test_weighted_majority_by_hand():
    pool = [
        {"id": 0, "text": "a", "reward": 0.9, "finish": "eos", "round": 1, "n_tokens": 1, "c": 0},
        {"id": 1, "text": "b", "reward": 0.3, "finish": "eos", "round": 1, "n_tokens": 1, "c": 0},
        {"id": 2, "text": "c", "reward": 0.5, "finish": "eos", "round": 2, "n_tokens": 1, "c": 0},
        {"id": 3, "text": "d", "reward": 0.4, "finish": "eos", "round": 2, "n_tokens": 1, "c": 0},
        {"id": 4, "text": "e", "reward": 2.0, "finish": "eos", "round": 3, "n_tokens": 1, "c": 0},
    ]
    # "8" sums 0.3 + 0.5 + 0.4 = 1.2 > "7" 0.9; its best-scored candidate is index 2; "e" has no answer
    assert weighted_majority(pool, whitespace_classes(["7", "8", " 8 ", "8", None])) == 2
    assert weighted_majority(pool, whitespace_classes(["7", "8", "9", "6", None])) == 0
    assert weighted_majority(pool, [None] * 5) is None
    # classes, not strings, vote: "16/2" and "8.0" in 8's class (as the task's math-verify puts them)
    # make it 1.2 > 0.9; as strings each would stand alone and "7" would win
    assert weighted_majority(pool, [0, 1, 1, 1, None]) == 2
    assert weighted_majority(pool, whitespace_classes(["7", "8", "16/2", "8.0", None])) == 0


def test_parameters_are_checked():
    with pytest.raises(ConfigError, match="multiple of beam_width"):
        build_method("beam_search", {"n": 6, "beam_width": 4})
    with pytest.raises(ConfigError, match="aggregation"):
        build_method("dvts", {"aggregation": "mean"})
    with pytest.raises(ConfigError, match="answer"):
        build_method("dvts", {"answer": "vote"})
    with pytest.raises(ConfigError, match="step_delimiter"):
        build_method("beam_search", {"step_delimiter": ""})
    assert unescape("\\n\\n") == "\n\n" and unescape("Step:") == "Step:" and unescape("é\\t") == "é\t"
    assert build_method("beam_search", {"step_delimiter": "\\n"}).params.delimiter == "\n"


@pytest.fixture(scope="module")
def testbed_engine():
    from srd_worker.engines.loading import load_model
    from srd_worker.engines.transformers_engine import TransformersEngine

    model, tokenizer = load_model("testbed", cache_dir=Path("."), dtype="float32")
    return TransformersEngine(model, tokenizer, max_batch_size=64, model_name="testbed")


@pytest.mark.parametrize("name", ["beam_search", "dvts"])
def test_steps_end_at_the_delimiter_on_the_testbed(testbed_engine, name):
    """The testbed policy writes one equation per line: every step of a beam is one line."""
    from srd_worker.rewards.arithmetic import ArithmeticReward
    from srd_worker.tasks.prompts import math_messages

    rows = [json.loads(x) for x in (TESTBED / "data" / "test.jsonl").read_text().splitlines()[:2]]
    method = build_method(
        name, {"n": 4, "beam_width": 2, "step_delimiter": "\\n", "chunk_tokens": 40, "max_new_tokens": 96}
    )
    task = GSM8KTask()
    ctx = StepContext(testbed_engine, ArithmeticReward(), run_seed=0, extract_answer=task.extract_answer)
    states = [
        method.init_state(
            r["id"], r["question"], testbed_engine.tokenizer.chat_prompt_ids(math_messages(r["question"]))
        )
        for r in rows
    ]
    while not all(method.done(s) for s in states):
        method.step([s for s in states if not method.done(s)], ctx)
    for s in states:
        for e in s["pool"]:
            assert e["finish"] == "eos", e
            lines = e["text"].split("\n")
            assert len(lines) >= 2 and "\\boxed{" in lines[-1]
        beams = [b for b in s["beams"] if b["finish"]]
        for b in beams:  # every step score sits right after a newline, but the last (the final answer)
            ends = sorted(int(k) for k in b["S"])
            assert all(testbed_engine.tokenizer.decode(b["tokens"][:j]).endswith("\n") for j in ends[:-1])
            assert len(ends) == b["text"].count("\n") + 1
        assert method.result(s)["steps"] == s["round"] <= 8


@pytest.fixture(scope="module")
def tiny_prm(tmp_path_factory):
    """A Skywork-style PRM (token head, one label, step token = newline): a random 2-layer Llama with the
    tiny byte tokenizer, saved and loaded by path through the hf-prm adapter."""
    import torch
    from transformers import LlamaConfig, LlamaForTokenClassification

    from srd_worker.engines.loading import build_tiny_llama
    from srd_worker.rewards.hf_prm import HFProcessReward

    _, tok = build_tiny_llama()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, num_labels=1, initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(2)
    path = tmp_path_factory.mktemp("prm") / "prm"
    model = LlamaForTokenClassification(config).eval()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return HFProcessReward(str(path), style="skywork", device="cpu", dtype="float32"), model


def test_step_scores_are_the_prm_step_scores(testbed_engine, tiny_prm):
    """With hf-prm (separator = step_delimiter), a beam's S holds the PRM's score of each of its steps,
    as one forward pass over the whole solution gives them, and min aggregation is their minimum."""
    import torch

    from srd_worker.tasks.prompts import math_messages

    prm, model = tiny_prm
    rows = [json.loads(x) for x in (TESTBED / "data" / "test.jsonl").read_text().splitlines()[1:3]]
    method = build_method(
        "beam_search",
        {"n": 4, "beam_width": 2, "step_delimiter": "\\n", "chunk_tokens": 40, "max_new_tokens": 96,
         "aggregation": "min"},
    )  # fmt: skip
    ctx = StepContext(testbed_engine, prm, run_seed=1)
    states = [
        method.init_state(
            r["id"], r["question"], testbed_engine.tokenizer.chat_prompt_ids(math_messages(r["question"]))
        )
        for r in rows
    ]
    while not all(method.done(s) for s in states):
        method.step([s for s in states if not method.done(s)], ctx)
    checked = 0
    for s in states:
        for b in s["beams"]:
            ids, _ = prm.input_ids(s["question"], b["text"], finished=b["finish"] == "eos")
            with torch.no_grad():
                values = torch.sigmoid(model(torch.tensor([ids])).logits[0, :, 0])
            tok = prm.tokenizer  # the steps follow bos + question + newline
            start = len(tok.encode(tok.bos_token + s["question"] + "\n", add_special_tokens=False))
            steps = [float(values[i]) for i, t in enumerate(ids) if t == prm.step_token_id and i >= start]
            got = [b["S"][k] for k in sorted(b["S"], key=int)]
            assert got == pytest.approx(steps, abs=1e-5)
            assert b["reward"] == pytest.approx(min(steps), abs=1e-5)
            checked += len(steps) >= 2
    assert checked >= 4


@pytest.mark.e2e
@pytest.mark.parametrize(
    "name, reward", [("beam_search", "arithmetic"), ("dvts", f"hf-orm:{TESTBED / 'rm'}")]
)  # each method and each reward once (the four pairs cost 4 x the CLI's model loading)
def test_srdq_run_on_the_testbed(tmp_path: Path, name: str, reward: str) -> None:
    from srdq_cli.main import cli

    out = tmp_path / "out"
    args = [
        "run", str(TESTBED / "data" / "test.jsonl"), "--limit", "3", "--method", name, "--n", "4",
        "--set", "beam_width=2", "--set", "step_delimiter=\\n", "--set", "chunk_tokens=40",
        "--model", "testbed", "--reward", reward, "--max-new-tokens", "96", "--out", str(out),
    ]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (results,) = out.glob("run-*/results.jsonl")
    records = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 3
    for r in records:
        assert r["error"] is None and r["method"] == name and isinstance(r["reward"], float)
        assert r["response"] == r["candidates"][r["extra"]["chosen"]]["text"]
        assert r["ledger"]["rm_calls"] >= 4 and r["ledger"]["gen_tokens"] > 0
    assert any("\\boxed{" in r["response"] for r in records)


@pytest.mark.parametrize("name", ["beam_search", "dvts"])
def test_chunk_tokens_zero_is_no_per_step_cap(tiny_engine, name):
    """chunk_tokens 0: a step runs to the delimiter, EOS or the whole remaining budget (ALGORITHMS §8.1)."""
    with pytest.raises(ConfigError, match=r"chunk_tokens must be >= 0 \(0 = no per-step cap\), got -1"):
        build_method(name, {"chunk_tokens": -1})
    method = build_method(name, {"n": 4, "beam_width": 2, "chunk_tokens": 0, "max_new_tokens": 24})
    ctx = StepContext(tiny_engine, ScriptedReward(), run_seed=5)
    states = start(method, tiny_engine)
    method.step(states, ctx)
    for s in states:
        for b in s["beams"]:
            # the tiny random model rarely writes a blank line: a step that met none took the whole budget
            assert b["text"].endswith("\n\n") or b["finish"] is not None
            assert b["finish"] != "length" or len(b["tokens"]) == 24
    assert any(len(b["tokens"]) == 24 for s in states for b in s["beams"])  # one step took the budget


def test_a_task_stop_string_finishes_the_beam_the_delimiter_only_ends_the_step(tiny_engine):
    """A step stopped at the delimiter goes on in the next step; one stopped at the task's stop string ends
    the response (finish ``stop``, §0.7), and on the last step, which runs without the delimiter, every stop
    is the task's."""
    from srd_worker.engines.base import Generation
    from srd_worker.methods.step_search import apply_step

    method = build_method("beam_search", {"n": 2, "beam_width": 1, "chunk_tokens": 8, "max_new_tokens": 64})
    ctx = StepContext(tiny_engine, ScriptedReward(), run_seed=0, stop=("Q:",))
    (state,) = start(method, tiny_engine, QUESTIONS[:1])

    def step(text: str, delimiter: str | None) -> Any:
        beam = {"tokens": [], "text": "", "S": {}, "finish": None}
        ids = tiny_engine.tokenizer.encode(text)
        apply_step(ctx, state, beam, Generation(ids, text, "stop"), 8, 64, delimiter)
        return beam["finish"]

    assert step("3 + 4 = 7\n\n", "\n\n") is None  # the step's own delimiter: the beam goes on
    assert step("The answer is 7\nQ:", "\n\n") == "stop"  # the task's stop string: the response ends
    assert step("The answer is 7\nQ:", None) == "stop"  # the last step
