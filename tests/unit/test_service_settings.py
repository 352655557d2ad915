"""Bad service settings get one line naming the setting, the password masked, exit 1, no traceback: a
database URL that does not parse, names an uninstalled driver, or is the bare ``postgresql://`` that
SQLAlchemy 2.1 maps to psycopg 3 (srdq maps it to psycopg2, which it installs)."""

from __future__ import annotations

import pytest

from srd_worker.errors import ConfigError
from srd_worker.store.db import make_engine, masked, normalise_url
from tests.cli import run_srdq, srdq_env

pytestmark = pytest.mark.unit


def test_bare_postgresql_urls_use_the_installed_driver():
    assert normalise_url("postgresql://u:p@h:5432/db") == "postgresql+psycopg2://u:p@h:5432/db"
    assert normalise_url("postgres://u@h/db") == "postgresql+psycopg2://u@h/db"
    for kept in ("postgresql+psycopg2://u@h/db", "sqlite:///x.db", "mysql://u@h/db"):
        assert normalise_url(kept) == kept
    engine = make_engine("postgresql://u:p@127.0.0.1:1/db")  # no connection is made here
    assert engine.url.drivername == "postgresql+psycopg2"
    engine.dispose()


@pytest.mark.parametrize(
    "url, says",
    [
        ("::not a url", "Could not parse"),
        ("postgresql+psycopg://u:secret@h/db", "No module named 'psycopg'"),
        ("nosuchdb://u:secret@h/db", "nosuchdb"),
    ],
)
def test_unusable_urls_raise_one_config_error_with_the_password_masked(url, says):
    with pytest.raises(ConfigError) as err:
        make_engine(url)
    msg = str(err.value)
    assert says in msg and "secret" not in msg and "SRDQ_DATABASE_URL" in msg
    assert "\n" not in msg


def test_masked():
    assert masked("postgresql+psycopg2://u:secret@h/db") == "postgresql+psycopg2://u:***@h/db"
    assert "secret" not in masked("::bad:secret@host")


@pytest.mark.parametrize("args", [["status"], ["status", "run-x"], ["cancel", "run-x"], ["resume", "run-x"]])
def test_commands_print_one_line_for_a_bad_database_url(args):
    proc = run_srdq(*args, env=srdq_env(SRDQ_DATABASE_URL="postgresql+psycopg://u:secret@127.0.0.1/db"))
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: database URL"), proc.stderr
    assert "secret" not in proc.stderr and "Traceback" not in proc.stderr
