"""benchmarks/srd_boundary.py: the sweep it runs has one rejection-sampling point and one SRD point per
(boundary_search, l_max) for every seed, all accepted by the sweep parser; and the prompt lengths it
subtracts from the editor's input tokens (to get the kept prefix j*) are the runner's own prompt ids."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from benchmarks import srd_boundary  # noqa: E402


def test_sweep_has_every_boundary_configuration_and_the_baseline_per_seed():
    from srd_worker.sweep import parse_sweep, prepare_sweep

    configs = srd_boundary._configs("whole:30,whole:8,tail:8,whole:0,tail:8:3")
    assert configs == [
        ("whole", 30, None),
        ("whole", 8, None),
        ("tail", 8, None),
        ("whole", 0, None),
        ("tail", 8, 3),
    ]
    sweep = srd_boundary.sweep_for("arithmetic", 5, [0, 1, 2], 8, configs, 96, 16)
    _, prepared = prepare_sweep(parse_sweep(sweep))
    points = {
        (
            p.spec.method,
            p.spec.params.get("boundary_search"),
            p.spec.params.get("l_max"),
            p.spec.params.get("scoring_interval"),
            p.spec.seed,
        )
        for p in prepared
    }
    expected = {("rejection_sampling", None, None, None, s) for s in (0, 1, 2)} | {
        ("srd", search, cap, m or 10, s) for search, cap, m in configs for s in (0, 1, 2)
    }
    assert points == expected
    assert all(p.spec.params["n"] == 8 and p.spec.params["chunk_tokens"] == 16 for p in prepared)
    assert len({p.spec.run_id() for p in prepared}) == 18
    labels = {srd_boundary.label(p.spec.model_dump()) for p in prepared}
    assert labels == {
        "rejection_sampling (θ 0.5)",
        "SRD whole, L_max 30",
        "SRD whole, L_max 8",
        "SRD tail, L_max 8",
        "SRD whole, L_max ∞ (0)",
        "SRD tail, L_max 8, m 3",
    }


def test_prompt_lengths_are_the_runners_prompt_ids():
    from srd_worker.datasets import resolve_dataset
    from srd_worker.engines.registry import build_engine
    from srd_worker.settings import Settings
    from srd_worker.tasks.registry import load_items

    lengths = srd_boundary.prompt_lengths()
    engine = build_engine("transformers", "testbed", Settings(device="cpu"))
    task, items = load_items(resolve_dataset("testbed"))
    for item in items[:20]:
        assert lengths[str(item.id)] == len(engine.tokenizer.chat_prompt_ids(task.messages(item)))
    assert len({lengths[str(i.id)] for i in items[:20]}) > 1  # lengths differ: a constant would not do
