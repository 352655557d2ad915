"""Sweep files: expansion, deterministic ids, one clear error per bad field (nothing run)."""

from __future__ import annotations

import json

import pytest

from srd_worker.errors import ConfigError
from srd_worker.sweep import load_sweep, parse_sweep, prepare_sweep

BASE = {"dataset": "d.jsonl", "model": "tiny-random-llama", "reward": "arithmetic"}


def test_expansion_order_and_grid():
    sweep = parse_sweep(
        {
            **BASE,
            "seeds": [0, 1],
            "methods": [
                {"method": "best_of_n", "n": [1, 4], "params": {"temperature": [0.6, 0.8], "top_k": 5}},
                {"method": "self_consistency", "n": 3},
            ],
        }
    )
    pts = [(r.method, r.params, r.seed) for r in sweep.runs]
    assert len(pts) == 2 * 2 * 2 + 2
    assert pts[:3] == [
        ("best_of_n", {"n": 1, "temperature": 0.6, "top_k": 5}, 0),
        ("best_of_n", {"n": 1, "temperature": 0.6, "top_k": 5}, 1),
        ("best_of_n", {"n": 1, "temperature": 0.8, "top_k": 5}, 0),
    ]
    assert pts[-1] == ("self_consistency", {"n": 3}, 1)
    assert (sweep.task, sweep.engine, sweep.limit) == ("auto", "transformers", None)


@pytest.mark.parametrize(
    "change,field",
    [
        ({"methods": []}, "methods"),
        ({"seeds": [1, 1]}, "seeds"),
        ({"seeds": "x"}, "seeds"),
        ({"limit": 0}, "limit"),
        ({"colour": 1}, "colour"),
        ({"methods": [{"method": "best_of_n", "n": 0}]}, "methods[0].n"),
        ({"methods": [{"method": "best_of_n", "params": {"n": 2}}]}, "methods[0].params.n"),
        ({"methods": [{"method": "best_of_n", "size": 2}]}, "methods[0].size"),
        ({"methods": [{"n": 2}]}, "methods[0].method"),
        ({"model": None}, "model"),
    ],
)
def test_bad_field_is_named(change, field):
    with pytest.raises(ConfigError) as exc:
        parse_sweep({**BASE, "methods": [{"method": "sampling"}], **change})
    assert f"'{field}'" in str(exc.value)


def test_missing_field_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="'methods' is missing"):
        parse_sweep(BASE)
    bad = tmp_path / "s.yaml"
    bad.write_text("dataset: x.jsonl\nmethods:\n  - method: srd\n    n: [4, 8\n")
    with pytest.raises(ConfigError) as info:
        load_sweep(bad)
    # one line: PyYAML's own message spans several, with the file shown as "<unicode string>"
    assert (
        str(info.value)
        == f"sweep file {bad}, line 5: not valid YAML: expected ',' or ']', but got '<stream end>'"
    )
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"dataset: x.jsonl\nname: caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        load_sweep(latin)
    assert str(info.value) == f"sweep file {latin}, line 2: not valid UTF-8 (byte 0xe9)"


def test_prepare_gives_a_deterministic_sweep_id_and_validates_every_point(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"{i}+{i}?", "answer": f"#### {2 * i}"}) + "\n" for i in range(3))
    )
    path = tmp_path / "sweep.yaml"
    path.write_text(
        "dataset: d.jsonl\nmodel: tiny-random-llama\nreward: arithmetic\nseeds: [0, 1]\n"
        "methods:\n  - method: best_of_n\n    n: [2, 4]\n    params: {max_new_tokens: 16}\n"
    )
    sid, prepared = prepare_sweep(load_sweep(path), base_dir=tmp_path)
    assert sid.startswith("sweep-") and len(sid) == 18 and len(prepared) == 4
    assert len({p.spec.run_id() for p in prepared}) == 4
    assert prepare_sweep(load_sweep(path), base_dir=tmp_path)[0] == sid
    path.write_text(path.read_text().replace("seeds: [0, 1]", "seeds: [0, 2]"))
    assert prepare_sweep(load_sweep(path), base_dir=tmp_path)[0] != sid
    path.write_text(path.read_text().replace("max_new_tokens: 16", "max_new_tokenz: 16"))
    with pytest.raises(ConfigError, match="sweep run 0 .*max_new_tokenz"):
        prepare_sweep(load_sweep(path), base_dir=tmp_path)


def test_a_key_written_twice_and_a_run_listed_twice_are_refused(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text("dataset: d.jsonl\nlimit: 2\nlimit: 3\nmethods:\n  - method: sampling\n")
    with pytest.raises(ConfigError) as info:
        load_sweep(path)  # safe_load kept the last value silently
    assert str(info.value) == f"sweep file {path}, line 3, key 'limit': duplicate key (first on line 2)"
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    for methods in (
        "  - method: best_of_n\n    n: [2, 2]\n",  # one value twice
        "  - method: best_of_n\n    n: 2\n  - method: best_of_n\n    n: 2\n",  # the same entry twice
    ):
        path.write_text(
            "dataset: d.jsonl\nmodel: tiny-random-llama\nreward: arithmetic\nmethods:\n" + methods
        )
        with pytest.raises(ConfigError, match=r"sweep runs 0 and 1 are the same run \(best_of_n, .*run-"):
            prepare_sweep(load_sweep(path), base_dir=tmp_path)
