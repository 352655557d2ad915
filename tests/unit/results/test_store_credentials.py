"""The default ``s3://`` store on a worker without S3 credentials: one warning when the worker starts and
uploads off (results stay in the database), instead of an "Unable to locate credentials" error after
every shard while ``srdq status`` says done."""

from __future__ import annotations

import logging

import pytest

from srd_worker.results.objects import LocalObjectStore, S3ObjectStore
from srd_worker.results.sync import store_from_settings
from srd_worker.settings import Settings


@pytest.fixture
def no_aws(monkeypatch, tmp_path):
    """An environment where boto3's chain finds nothing: no variables, no files, no instance role."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_no_credentials_turns_uploads_off_with_one_warning(no_aws, caplog):
    with caplog.at_level(logging.WARNING, logger="srdq"):
        assert store_from_settings(Settings(object_store_url="s3://srdq-results")) is None
    (line,) = [r.getMessage() for r in caplog.records if "S3 credentials" in r.getMessage()]
    assert "s3://srdq-results" in line and "results stay in the database" in line and "srdq sync" in line


def test_credentials_from_the_chain_or_the_settings_keep_the_store(no_aws, monkeypatch):
    keys = Settings(object_store_url="s3://srdq-results", aws_access_key_id="k", aws_secret_access_key="s")
    assert isinstance(store_from_settings(keys), S3ObjectStore)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    assert isinstance(store_from_settings(Settings(object_store_url="s3://srdq-results/p")), S3ObjectStore)


def test_a_folder_store_needs_no_credentials(no_aws, tmp_path):
    assert isinstance(
        store_from_settings(Settings(object_store_url=str(tmp_path / "results"))), LocalObjectStore
    )
