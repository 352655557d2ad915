"""Engine arguments (issue 28): ``--engine-arg KEY=VALUE`` on `srdq run` / `srdq submit dataset` and a sweep
file's ``engine_args:``, checked against the engine's accepted arguments before anything is written, named
by the run id and recorded in the run's provenance, and honoured by the engine a run (or a fleet worker)
builds. The vLLM half (EngineArgs introspection, max_model_len honoured) is in tests/vllm/test_engine_args.py;
here vLLM is not installed."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from srd_worker.engines.engine_args import check_engine_args, parse_engine_arg_pairs, parse_scalar
from srd_worker.errors import CapabilityError, ConfigError, EngineError
from srd_worker.settings import Settings
from srd_worker.spec import prepare_run

BASE = dict(dtype="float32", device="cpu", batch_invariant=False, kv_reuse=False)


# ------------------------------------------------------------------------------------------ parsing
def test_pairs_need_key_and_value_once():
    assert parse_engine_arg_pairs(["a=1", " b = x=y "]) == {"a": "1", "b": "x=y"}
    with pytest.raises(ConfigError, match="expects KEY=VALUE, got 'eager'"):
        parse_engine_arg_pairs(["eager"])
    with pytest.raises(ConfigError, match="expects KEY=VALUE"):
        parse_engine_arg_pairs(["=3"])
    with pytest.raises(ConfigError, match="revision is given twice"):
        parse_engine_arg_pairs(["revision=a", "revision=b"])


@pytest.mark.parametrize(
    "text, value",
    [("1024", 1024), ("0.5", 0.5), ("true", True), ("false", False), ("null", None), ("eager", "eager"),
     ("", ""), ("[1, 2]", "[1, 2]"), ("{a: 1}", "{a: 1}")],
)  # fmt: skip
def test_values_are_yaml_scalars(text, value):
    assert parse_scalar(text) == value and type(parse_scalar(text)) is type(value)


def test_transformers_arguments_are_checked_and_typed():
    args = {
        "attn_implementation": "eager",
        "torch_dtype": "bfloat16",
        "revision": "1234",
        "max_batch_size": "8",
    }
    assert check_engine_args("transformers", args, raw=True) == {
        "attn_implementation": "eager",
        "dtype": "bfloat16",  # the alias is renamed: one run id for both spellings
        "max_batch_size": 8,
        "revision": "1234",  # takes text: kept as given, not the integer YAML reads
    }
    # typed values (a sweep file) pass through the same checks
    assert check_engine_args("transformers", {"trust_remote_code": False, "revision": 7}) == {
        "revision": "7",
        "trust_remote_code": False,
    }


@pytest.mark.parametrize(
    "engine, args, message",
    [
        ("transformers", {"attn_implemntation": "eager"},
         "--engine-arg attn_implemntation: not an argument of the transformers engine; did you mean attn_implementation?"),
        ("transformers", {"max_batch_size": "abc"}, "--engine-arg max_batch_size='abc': expects an integer"),
        ("transformers", {"max_batch_size": "0"}, "max_batch_size must be >= 1, got 0"),
        ("transformers", {"trust_remote_code": "maybe"}, "trust_remote_code='maybe': expects true or false"),
        ("transformers", {"dtype": "float64"}, "dtype='float64': expects one of 'auto', 'bfloat16'"),
        ("transformers", {"dtype": "float32", "torch_dtype": "float32"}, "torch_dtype: given twice"),
        ("transformers", {"quantization": "fp8"}, "not an argument of the transformers engine; accepted: "),
        ("openai", {"apii": "chat"}, "--engine-arg apii: not an argument of the openai engine; did you mean api?"),
        ("openai", {"api": "chats"}, "api='chats': expects one of 'completions', 'chat'"),
        ("openai", {"body.temperature": "0"}, "the openai engine sets 'temperature' itself"),
        ("openai", {"header.Authorization": "Bearer x"}, "SRDQ_OPENAI_API_KEY"),
        ("openai", {"continue_final_message": "sometimes"}, "expects true or false"),
    ],
)  # fmt: skip
def test_bad_keys_and_values_are_refused_by_name(engine, args, message):
    with pytest.raises(ConfigError) as err:
        check_engine_args(engine, args, raw=True)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_structured_values_are_refused_in_sweep_files():
    with pytest.raises(ConfigError, match=r"engine_args revision: give a scalar"):
        check_engine_args("transformers", {"revision": ["a"]}, where="engine_args")


def test_openai_extras():
    got = check_engine_args(
        "openai",
        {"api": "chat", "body.min_p": "0.05", "header.X-Team": "42", "continue_final_message": "no"},
        raw=True,
    )
    assert got == {"api": "chat", "body.min_p": 0.05, "continue_final_message": False, "header.X-Team": "42"}


def test_vllm_arguments_pass_unchecked_only_where_vllm_is_missing(caplog):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed: tests/vllm/test_engine_args.py checks its arguments")
    with caplog.at_level("WARNING"):
        assert check_engine_args("vllm", {"max_model_len": "1024"}, raw=True) == {"max_model_len": 1024}
    assert "checked by the workers" in caplog.text
    with pytest.raises(ConfigError, match="srdq sets vLLM's model from --model"):
        check_engine_args("vllm", {"model": "other"}, raw=True)


# ------------------------------------------------------------------------------- spec, run id, wiring
def _prepared(datasets_dir, engine="transformers", engine_args=None, method="sampling", params=None, **kw):
    return prepare_run(
        dataset=datasets_dir / "gsm8k_test.jsonl",
        method=method,
        params=params or {},
        model="tiny-random-llama",
        reward=kw.pop("reward", None),
        limit=2,
        engine=engine,
        settings=Settings(**BASE),
        engine_args=engine_args,
        engine_args_raw=True,
    )


def test_engine_args_are_in_the_spec_and_the_run_id(datasets_dir):
    plain = _prepared(datasets_dir).spec
    eager = _prepared(datasets_dir, engine_args={"attn_implementation": "eager"}).spec
    assert plain.engine_args == {} and "engine_args" not in json.dumps(
        plain.model_dump(exclude={"engine_args"})
    )
    assert eager.engine_args == {"attn_implementation": "eager"}
    assert eager.run_id() != plain.run_id()
    # same arguments, other spelling or order: the same run
    again = _prepared(datasets_dir, engine_args={"attn_implementation": "eager"}).spec
    assert again.run_id() == eager.run_id()
    # the run id of a spec without engine arguments is the one it had before they existed
    assert plain.config_hash() == type(plain)(**plain.model_dump()).config_hash()
    body = plain.model_dump(exclude={"dataset", "engine_args", "fields", "task_def", "forked_from"})
    import hashlib

    from srd_worker.encoding import sorted_json

    text = sorted_json(body, compact=False, ascii=True, allow_nan=True)
    assert plain.config_hash() == hashlib.sha256(text.encode()).hexdigest()


def test_an_engine_arg_takes_its_key_out_of_the_settings_config(datasets_dir):
    spec = _prepared(datasets_dir, engine_args={"dtype": "bfloat16"}).spec
    assert "dtype" not in spec.engine_config and spec.engine_args == {"dtype": "bfloat16"}
    assert spec.engine_config["device"] == "cpu"  # the other settings are still named


def test_the_chat_api_refuses_what_it_cannot_do(datasets_dir):
    chat = {"api": "chat"}
    # whole-budget pools need no continuation; with continue_final_message (the default) SRD is accepted
    _prepared(
        datasets_dir,
        engine="openai",
        engine_args=chat,
        method="best_of_n",
        params={"n": 2},
        reward="arithmetic",
    )
    _prepared(datasets_dir, engine="openai", engine_args=chat, method="srd", reward="arithmetic")
    no_continue = {"api": "chat", "continue_final_message": "false"}
    _prepared(datasets_dir, engine="openai", engine_args=no_continue, method="sampling")
    with pytest.raises(CapabilityError, match="method 'srd' continues partial answers"):
        _prepared(datasets_dir, engine="openai", engine_args=no_continue, method="srd", reward="arithmetic")
    with pytest.raises(CapabilityError, match="method 'sampling' continues partial answers"):
        _prepared(datasets_dir, engine="openai", engine_args=no_continue, params={"chunk_tokens": 8})
    with pytest.raises(CapabilityError, match="the logprob reward scores with the run's model"):
        _prepared(datasets_dir, engine="openai", engine_args=chat, method="best_of_n", reward="logprob")
    # the completions API keeps every capability
    from srd_worker.engines.registry import engine_capabilities

    assert "logprobs" in engine_capabilities("openai", {"api": "completions"})
    assert engine_capabilities("openai", chat) == {"sampling"}


# ------------------------------------------------------------------------------------------ the CLI
def test_cli_refuses_an_unknown_key_in_one_line_and_writes_nothing(tmp_path):
    from srdq_cli.main import cli

    out = tmp_path / "out"
    res = CliRunner().invoke(
        cli,
        ["run", "gsm8k", "--method", "sampling", "--model", "tiny-random-llama", "--limit", "1", "--out", str(out),
         "--engine-arg", "attn_implemntation=eager"],
    )  # fmt: skip
    assert res.exit_code == 1
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "did you mean attn_implementation?" in lines[0], res.output
    assert not out.exists()


def test_cli_refuses_a_file_argument_for_the_tiny_model_before_writing_anything(tmp_path):
    """``revision`` is a valid transformers argument, but the built-in tiny model has no files: refused at
    the check of the model's sources, before ``srdq.db`` exists (it used to be refused at load time)."""
    from srdq_cli.main import cli

    out = tmp_path / "out"
    res = CliRunner().invoke(
        cli,
        ["run", "gsm8k", "--method", "sampling", "--model", "tiny-random-llama", "--limit", "1", "--out", str(out),
         "--engine-arg", "revision=main", "--engine-arg", "dtype=float32"],
    )  # fmt: skip
    assert res.exit_code == 1
    assert "engine argument(s) revision do not apply to the built-in 'tiny-random-llama'" in res.output
    assert not out.exists()


def test_cli_refuses_a_bad_value_and_engine_args_with_a_sweep(tmp_path):
    from srdq_cli.main import cli

    out = tmp_path / "out"
    res = CliRunner().invoke(
        cli,
        ["submit", "dataset", "gsm8k", "--method", "sampling", "--model", "tiny-random-llama", "--dry-run",
         "--engine-arg", "max_batch_size=lots"],
    )  # fmt: skip
    assert res.exit_code == 1 and "max_batch_size='lots': expects an integer" in res.output
    sweep = tmp_path / "s.yaml"
    sweep.write_text("dataset: gsm8k\nmodel: tiny-random-llama\nmethods: [{method: sampling}]\n")
    res = CliRunner().invoke(
        cli, ["run", "--sweep", str(sweep), "--engine-arg", "dtype=float32", "--out", str(out)]
    )
    assert res.exit_code == 2 and "--engine-arg cannot be combined with --sweep" in res.output
    assert not out.exists()


def test_submit_dry_run_names_the_engine_args_run(tmp_path):
    from srdq_cli.main import cli

    args = ["submit", "dataset", "gsm8k", "--method", "sampling", "--model", "tiny-random-llama", "--limit", "2",
            "--dry-run"]  # fmt: skip
    plain = CliRunner().invoke(cli, args)
    eager = CliRunner().invoke(cli, [*args, "--engine-arg", "attn_implementation=eager"])
    assert plain.exit_code == 0 and eager.exit_code == 0, plain.output + eager.output
    assert plain.output.split(":")[0] != eager.output.split(":")[0]


def test_a_transformers_run_honours_its_engine_args_and_records_them(tmp_path, monkeypatch):
    """`srdq run --engine-arg attn_implementation=eager --engine-arg dtype=bfloat16` on the tiny random Llama:
    the engine is built with eager attention in bf16, and the run's runtime record says so."""
    from srdq_cli.main import cli

    from srd_worker.engines import registry
    from srd_worker.store import crud
    from srd_worker.store.db import make_engine, session_scope, sqlite_url

    built = []
    real = registry.ENGINES["transformers"]

    def spy(model, settings, engine_args):
        engine = real.factory(model, settings, engine_args)
        built.append(engine)
        return engine

    import dataclasses

    monkeypatch.setitem(registry.ENGINES, "transformers", dataclasses.replace(real, factory=spy))
    monkeypatch.setenv("SRDQ_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    res = CliRunner().invoke(
        cli,
        ["run", "gsm8k", "--method", "sampling", "--model", "tiny-random-llama", "--limit", "1",
         "--max-new-tokens", "4", "--out", str(out), "--engine-arg", "attn_implementation=eager",
         "--engine-arg", "torch_dtype=bfloat16"],
        catch_exceptions=False,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (engine,) = built
    import torch

    assert engine.model.config._attn_implementation == "eager"
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    db = make_engine(sqlite_url(out / "srdq.db"))
    try:
        with session_scope(db) as session:
            run = crud.get_run(session=session, run_id=next(out.glob("run-*")).name)
            spec, versions = dict(run.spec), dict(run.versions)
    finally:
        db.dispose()
    assert spec["engine_args"] == {"attn_implementation": "eager", "dtype": "bfloat16"}
    (record,) = versions["runtime"]
    assert record["engine"]["args"] == {"attn_implementation": "eager", "dtype": "bfloat16"}
    assert "dtype" not in record["engine"]["config"]  # the engine argument won over SRDQ_DTYPE


def test_the_default_engine_keeps_sdpa_and_the_tiny_model_refuses_file_arguments(tmp_path):
    from srd_worker.engines.registry import build_engine
    from srd_worker.errors import ModelLoadError

    settings = Settings(cache_dir=tmp_path, **BASE)
    assert (
        build_engine("transformers", "tiny-random-llama", settings).model.config._attn_implementation
        == "sdpa"
    )
    engine = build_engine("transformers", "tiny-random-llama", settings, {"max_batch_size": 3})
    assert engine.max_batch_size == 3
    with pytest.raises(ModelLoadError, match="revision do not apply to the built-in 'tiny-random-llama'"):
        build_engine("transformers", "tiny-random-llama", settings, {"revision": "main"})


# ------------------------------------------------------------------------------------------ sweeps
def test_sweep_files_carry_engine_args(tmp_path, datasets_dir):
    from srd_worker.sweep import load_sweep, prepare_sweep

    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"dataset: {datasets_dir / 'gsm8k_test.jsonl'}\nmodel: tiny-random-llama\nlimit: 2\n"
        "engine_args: {attn_implementation: eager, max_batch_size: 4}\nmethods: [{method: sampling}]\n"
    )
    _, (prepared,) = prepare_sweep(load_sweep(path), settings=Settings(**BASE))
    assert prepared.spec.engine_args == {"attn_implementation": "eager", "max_batch_size": 4}
    path.write_text(path.read_text().replace("max_batch_size", "max_batchsize"))
    with pytest.raises(ConfigError, match="engine_args max_batchsize: .*did you mean max_batch_size"):
        prepare_sweep(load_sweep(path), settings=Settings(**BASE))
    path.write_text(path.read_text().replace("{attn_implementation: eager, max_batchsize: 4}", "[eager]"))
    with pytest.raises(ConfigError, match="sweep field 'engine_args' must be a mapping"):
        load_sweep(path)


# ------------------------------------------------------------------------------------- fleet workers
def test_gpu_worker_plan():
    from srd_worker.service import plan_gpu_workers

    one_each = plan_gpu_workers("0,1,2,3")
    assert [(w.gpus, w.pool) for w in one_each] == [(("0",), "prefork"), (("1",), "prefork"),
                                                   (("2",), "prefork"), (("3",), "prefork")]  # fmt: skip
    pairs = plan_gpu_workers("0,1,2,3", 2)
    assert [(w.gpus, w.pool) for w in pairs] == [(("0", "1"), "solo"), (("2", "3"), "solo")]
    assert pairs[1].env == {"CUDA_VISIBLE_DEVICES": "2,3", "SRDQ_DEVICE": "cuda:0"}
    for gpus, per, message in [("0,1,2", 2, "does not divide the 3 GPUs"), ("0,0", 1, "names a GPU twice"),
                               ("a,b", 1, "comma-separated GPU numbers"), ("0", 0, "must be >= 1")]:  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            plan_gpu_workers(gpus, per)


def test_worker_cli_refuses_gpus_per_worker_without_gpus():
    from srdq_cli.main import cli

    res = CliRunner().invoke(cli, ["worker", "--gpus-per-worker", "2"])
    assert res.exit_code == 2 and "--gpus-per-worker needs --gpus" in res.output
    res = CliRunner().invoke(cli, ["worker", "--gpus", "0,1,2", "--gpus-per-worker", "2"])
    assert res.exit_code == 1 and "does not divide the 3 GPUs" in res.output


def _prepare_in_child(conn, kwargs):
    from srd_worker.engines.vllm_engine import prepare_process

    try:
        prepare_process(kwargs)
        conn.send("ok")
    except EngineError as exc:
        conn.send(str(exc))


@pytest.mark.parametrize("daemon", [True, False])
def test_a_daemonic_worker_refuses_a_multi_gpu_engine_a_solo_one_allows_it(daemon):
    """A real child process: daemonic (a Celery prefork pool child) refuses tensor_parallel_size=2 with the
    way out; a non-daemonic one (a solo-pool worker, `--gpus-per-worker 2`) lets vLLM start its processes."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_prepare_in_child, args=(child, {"tensor_parallel_size": 2}), daemon=daemon)
    proc.start()
    answer = parent.recv() if parent.poll(120) else "no answer"
    proc.join(30)
    if daemon:
        assert "--gpus-per-worker 2" in answer and "tensor_parallel_size=2" in answer
    else:
        assert answer == "ok"


def test_an_engine_wider_than_the_visible_gpus_is_refused(monkeypatch):
    from srd_worker.engines.vllm_engine import check_visible_gpus, devices_needed

    assert devices_needed({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}) == 4
    check_visible_gpus({"tensor_parallel_size": 2}, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(EngineError, match=r"needs 2 GPUs \(tensor_parallel_size=2\) but this process sees 1 "
                                          r"\(CUDA_VISIBLE_DEVICES=3\).*--gpus-per-worker 2"):  # fmt: skip
        check_visible_gpus({"tensor_parallel_size": 2}, 1)


def test_a_fleet_worker_builds_the_engine_its_run_names(tmp_path):
    from srd_worker.service import EngineCache

    cache = EngineCache(Settings(cache_dir=tmp_path, **BASE))
    eager = cache.get("tiny-random-llama", "transformers", {}, {"attn_implementation": "eager"})
    plain = cache.get("tiny-random-llama", "transformers", {}, {})
    assert eager is not plain
    assert (
        eager.model.config._attn_implementation == "eager"
        and plain.model.config._attn_implementation == "sdpa"
    )
    assert cache.get("tiny-random-llama", "transformers", {}, {"attn_implementation": "eager"}) is eager
    with pytest.raises(ConfigError, match="the run's engine_args: attn: not an argument"):
        cache.get("tiny-random-llama", "transformers", {}, {"attn": "eager"})


# ------------------------------------------------------------------------- the chat API's messages
def test_chat_prompts_recover_messages_and_the_kept_prefix():
    """The openai engine's api=chat turns srdq's prompt ids back into messages: the chat template rendered
    with placeholders, matched, and checked by encoding again (tests/vllm/test_openai.py sends them)."""
    from srd_worker.engines.loading import build_tiny_llama
    from srd_worker.engines.openai_engine import ChatPrompts
    from srd_worker.engines.transformers_engine import HFTokenizer

    _, hf = build_tiny_llama(hidden_size=8, layers=1)
    tok = HFTokenizer(hf)
    chat = ChatPrompts(hf)
    system_user = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2 + 2?\n<|im_end|> x"},
    ]
    for messages in (system_user, system_user[1:]):
        prompt = tok.chat_prompt_ids(messages)
        assert chat.split(prompt) == (messages, [])
        kept = tok.encode("Step 1: 2 + 2 = 4")
        assert chat.split(prompt + kept) == (messages, kept)
        assert chat.text(kept) == "Step 1: 2 + 2 = 4"
    with pytest.raises(EngineError, match="request 3: its prompt is not the tokenizer's chat template"):
        chat.split(tok.encode("plain text"), 3)
    hf.chat_template = None
    with pytest.raises(ConfigError, match="api=chat needs the tokenizer's chat template"):
        ChatPrompts(hf)
