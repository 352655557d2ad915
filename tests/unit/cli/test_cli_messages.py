"""What the CLI says: after `srdq run`, a follow-up command without --db (status, report, export, ...) that
cannot use the fleet database names the local store to pass; `srdq methods NAME`; `srdq db upgrade`."""

from __future__ import annotations

from click.testing import CliRunner
from srdq_cli.main import cli


def _status(tmp_path, monkeypatch) -> str:
    monkeypatch.chdir(tmp_path)
    # a fleet database that cannot be opened (a SQLite file in a folder that does not exist)
    monkeypatch.setenv("SRDQ_DATABASE_URL", f"sqlite:///{tmp_path}/no/such/dir/fleet.db")
    result = CliRunner().invoke(cli, ["status"])
    assert result.exit_code == 1
    return result.output


def test_names_the_local_store_of_srdq_run(tmp_path, monkeypatch) -> None:
    (tmp_path / "srdq-out").mkdir()
    (tmp_path / "srdq-out" / "srdq.db").touch()
    out = _status(tmp_path, monkeypatch)
    assert "for a local `srdq run` store pass --db srdq-out" in out
    assert len(out.strip().splitlines()) == 1


def test_without_a_local_store_says_how_to_fix_the_url(tmp_path, monkeypatch) -> None:
    out = _status(tmp_path, monkeypatch)
    assert "check the URL (SRDQ_DATABASE_URL or --db)" in out and "srdq run" not in out


def test_methods_names_one_method_and_refuses_an_unknown_one() -> None:
    one = CliRunner().invoke(cli, ["methods", "srd", "--json"])
    assert one.exit_code == 0, one.output
    import json

    data = json.loads(one.output)
    assert list(data) == ["srd"] and data["srd"]["needs_reward"] is True
    bad = CliRunner().invoke(cli, ["methods", "nope"])
    assert bad.exit_code == 2 and "unknown method 'nope'" in bad.output


def test_db_upgrade_says_what_it_did(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SRDQ_DATABASE_URL", f"sqlite:///{tmp_path}/fleet.db")
    first = CliRunner().invoke(cli, ["db", "upgrade"])
    assert first.exit_code == 0 and first.output.startswith("created the srdq schema (revision ")
    again = CliRunner().invoke(cli, ["db", "upgrade"])
    assert again.exit_code == 0 and again.output.startswith("database is already at the newest schema")


def _run_that_stops(tmp_path, monkeypatch, datasets_dir, error: Exception):
    """`srdq run` whose run starts (its store made, the first line printed) and then stops on ``error``."""
    import srd_worker.local

    def stops(prepared, *, out_dir, on_start, **_kwargs):
        on_start("run-stopped", 4, 4)
        raise error

    monkeypatch.setattr(srd_worker.local, "run_local", stops)
    monkeypatch.setenv("SRDQ_CACHE_DIR", str(tmp_path / "cache"))
    args = [
        "run",
        str(datasets_dir / "gsm8k_test.jsonl"),
        "--method",
        "sampling",
        "--model",
        "tiny-random-llama",
    ]
    return CliRunner().invoke(cli, [*args, "--limit", "4", "--out", str(tmp_path / "out")])


def test_a_run_stopped_by_a_lost_engine_says_how_to_resume(tmp_path, monkeypatch, datasets_dir) -> None:
    """The engine dying, a lost server, memory: one line with the cause and how to resume, no traceback."""
    result = _run_that_stops(tmp_path, monkeypatch, datasets_dir, ConnectionError("server went away\nmore"))
    text = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert "the run stopped: ConnectionError: server went away (every finished round is checkpointed" in text
    assert "run the same command again to resume once the cause is fixed)" in text
    assert "Traceback" not in result.output and "more" not in text


def test_a_run_stopped_by_a_bug_keeps_its_traceback(tmp_path, monkeypatch, datasets_dir) -> None:
    result = _run_that_stops(tmp_path, monkeypatch, datasets_dir, ZeroDivisionError("a bug"))
    assert isinstance(result.exception, ZeroDivisionError)  # raised on: the traceback reaches the user
    assert "run the same command again to resume" in " ".join(result.output.split())


def test_a_missing_or_empty_sqlite_store_is_named_and_never_created(tmp_path) -> None:
    missing, empty = tmp_path / "nope.db", tmp_path / "empty.db"
    empty.touch()
    for args, says in (
        (
            ["report", "run-x", "--out", str(tmp_path / "r"), "--db", f"sqlite:///{missing}"],
            "no such database file",
        ),
        (["status", "run-x", "--db", f"sqlite:///{missing}"], "no such database file"),
        (["status", "run-x", "--db", str(empty)], "is empty, not a srdq store"),
        (["export", "run-x", "--out", str(tmp_path / "e.jsonl"), "--db", f"sqlite:///{empty}"], "is empty"),
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1 and says in result.output, (args, result.output)
    assert not missing.exists() and empty.stat().st_size == 0  # SQLite created or wrote nothing
    assert not (tmp_path / "r").exists() and not (tmp_path / "e.jsonl").exists()


def test_a_dedicated_option_and_a_set_of_the_same_key_must_agree(tmp_path) -> None:
    from srdq_cli.main import _method_params

    assert _method_params(2, 64, ("n=2", "temperature=0.5")) == {
        "n": "2",
        "max_new_tokens": 64,
        "temperature": "0.5",
    }
    assert _method_params(None, None, ("n=3",)) == {"n": "3"}
    args = ["run", "gsm8k", "--method", "best_of_n", "--reward", "arithmetic", "--out", str(tmp_path / "o")]
    for extra, says in (
        (["--n", "2", "--set", "n=3"], "--n 2 and --set n=3 disagree: give n once"),
        (
            ["--max-new-tokens", "8", "--set", "max_new_tokens=x"],
            "--max-new-tokens 8 and --set max_new_tokens=x",
        ),
    ):
        result = CliRunner().invoke(cli, args + extra)
        assert result.exit_code == 2 and says in result.output, result.output
    assert not (tmp_path / "o").exists()


def test_a_run_whose_items_fail_says_why_under_its_summary(tmp_path, monkeypatch, datasets_dir) -> None:
    """Weighted Best-of-N under a reward with negative scores (the testbed RM's logits) fails every item:
    the summary names the error and how many items it failed, and summary.json keeps it."""
    import json

    monkeypatch.setenv("SRDQ_CACHE_DIR", str(tmp_path / "cache"))
    args = ["run", str(datasets_dir / "gsm8k_test.jsonl"), "--method", "best_of_n", "--n", "2"]
    args += ["--model", "tiny-random-llama", "--reward", "hf-orm:testbed-rm", "--max-new-tokens", "8"]
    args += ["--set", "answer=weighted_majority", "--limit", "2", "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    # the two items' messages differ only in the reward they name: one failure, counted twice
    assert text.count("failed (2 items): ValueError: answer=weighted_majority weighs votes by reward") == 1
    assert "(and 1 more like it with other numbers)" in text
    (summary,) = (tmp_path / "out").glob("run-*/summary.json")
    errors = json.loads(summary.read_text())["errors"]
    assert list(errors.values()) == [2] and all("use answer=best" in e for e in errors)


def test_item_errors_are_grouped_by_their_shape():
    from srd_worker.local import error_groups

    errors = [
        "ValueError: gave -2.5 (use answer=best)\nTraceback ...",
        "ValueError: gave -0.25 (use answer=best)",
        "ValueError: gave -2.5 (use answer=best)",
        "EngineError: prompt of 5000 tokens exceeds max_model_len 4096",
        "RuntimeError: x1 broke",
        "RuntimeError: x2 broke",  # a digit inside a word is part of a name, not a number
        "KeyError: 'q7'",
    ]
    assert error_groups(errors) == {
        "ValueError: gave -2.5 (use answer=best) (and 1 more like it with other numbers)": 3,
        "EngineError: prompt of 5000 tokens exceeds max_model_len 4096": 1,
        "RuntimeError: x1 broke": 1,
    }
    assert error_groups(errors, most=10)["RuntimeError: x2 broke"] == 1
    assert error_groups([]) == {}
