"""Model and reward paths are probed before anything is written (`srdq run`): a folder without a model, a
config-only folder, corrupt or truncated safetensors, a missing path, an `hf-orm:` path that is not a
model each give one line naming the path and the problem, exit 1, and no output folder."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from srd_worker.engines.loading import probe_model
from srd_worker.errors import ModelLoadError
from tests.cli import run_srdq

pytestmark = pytest.mark.unit


def _safetensors(path: Path, *, truncate: int = 0, garbage: bool = False) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    data = b"garbage!" if garbage else struct.pack("<Q", len(header)) + header + bytes(16)
    path.write_bytes(data[: len(data) - truncate] if truncate else data)


def _folder(tmp_path: Path, *, config=True, weights="ok", tokenizer=True) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    if config:
        (folder / "config.json").write_text("{}")
    if weights:
        _safetensors(
            folder / "model.safetensors", truncate=5 if weights == "short" else 0, garbage=weights == "bad"
        )
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    return folder


@pytest.mark.parametrize(
    "shape, says",
    [
        ({"config": False, "weights": None, "tokenizer": False}, "holds no config.json"),
        ({"weights": None}, "holds a config but no weights"),
        ({"weights": "bad"}, "not a readable safetensors file"),
        ({"weights": "short"}, "are truncated"),
        ({"tokenizer": False}, "holds no tokenizer"),
    ],
)
def test_bad_model_folders_are_named(tmp_path, shape, says):
    folder = _folder(tmp_path, **shape)
    with pytest.raises(ModelLoadError, match=says):
        probe_model(str(folder))


@pytest.mark.parametrize(
    "file, text, says",
    [
        ("config.json", "[1]", "model config '.*config.json' is a JSON list, not an object"),
        ("config.json", "{", "model config '.*config.json' is not readable JSON"),
        (
            "config.json",
            '{"model_type": "no-such-type"}',
            "names model_type 'no-such-type', which the installed transformers does not know",
        ),
        ("tokenizer.json", "garbage", "model tokenizer file '.*tokenizer.json' is not readable JSON"),
        (
            "chat_template.jinja",
            "{% for %}",
            "model chat template '.*chat_template.jinja', line 1 does not compile",
        ),
    ],
)
def test_a_config_tokenizer_or_chat_template_that_cannot_load_is_named(tmp_path, file, text, says):
    folder = _folder(tmp_path)
    (folder / file).write_text(text)
    with pytest.raises(ModelLoadError, match=says):
        probe_model(str(folder))


def test_a_model_type_only_vllm_may_know_passes_where_vllm_runs_it(tmp_path):
    folder = _folder(tmp_path)
    (folder / "config.json").write_text('{"model_type": "no-such-type"}')
    probe_model(str(folder), allow_remote=True)  # the vllm engine: vLLM has architectures of its own
    with pytest.raises(ModelLoadError, match="does not know"):
        probe_model(str(folder))


def test_transformers_own_template_tags_compile(tmp_path):
    folder = _folder(tmp_path)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    )
    probe_model(str(folder))


def test_a_good_folder_and_built_in_names_pass(tmp_path):
    probe_model(str(_folder(tmp_path)))
    probe_model("tiny-random-llama")
    probe_model("testbed")


def test_missing_paths_and_uncached_ids(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        probe_model(str(tmp_path / "nope"))
    with pytest.raises(ModelLoadError, match="neither a folder nor a model in the local Hugging Face cache"):
        probe_model("no-such-org/no-such-model-srdq")
    probe_model("no-such-org/no-such-model-srdq", allow_remote=True)  # vLLM fetches hub ids itself


@pytest.mark.parametrize("where", ["model", "reward"])
def test_run_refuses_a_bad_model_before_writing_anything(tmp_path, where):
    folder = _folder(tmp_path, weights="short")
    data = tmp_path / "d.jsonl"
    data.write_text('{"question": "What is 1+1?", "answer": "#### 2"}\n')
    out = tmp_path / "out"
    args = ["run", str(data), "--task", "gsm8k", "--out", str(out)]
    if where == "model":
        args += ["--method", "sampling", "--model", str(folder)]
    else:
        args += [
            "--method",
            "best_of_n",
            "--n",
            "2",
            "--model",
            "tiny-random-llama",
            "--reward",
            f"hf-orm:{folder}",
        ]
    proc = run_srdq(*args)
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "truncated" in lines[0] and str(folder) in lines[0], proc.stderr
    assert ("reward model (hf-orm)" in lines[0]) == (where == "reward")
    assert not out.exists()
