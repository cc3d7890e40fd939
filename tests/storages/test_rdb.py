"""Opening a database: errors that name it (its password masked) before anything is stored, and
where its artifacts go."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

import optuna_quant as oq
from optuna_quant.storages.factory import open_storage
from optuna_quant.storages.rdb import DEFAULT_ARTIFACT_DIR
from optuna_quant.storages.rdb import default_artifact_dir
from optuna_quant.storages.urls import sqlite_file
from optuna_quant.storages.urls import StorageError
from optuna_quant.testing.postgres import free_port


def test_unreachable_storage_is_named_with_its_password_masked(tmp_path, monkeypatch, calib, agreement) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"postgresql+psycopg2://quant:s3cret@127.0.0.1:{free_port()}/studies"
    # The model does not exist either: the storage is checked first, before any work.
    with pytest.raises(StorageError, match=r"127\.0\.0\.1") as err:
        oq.create_study(tmp_path / "missing.onnx", calib, agreement, storage=url)
    assert "s3cret" not in str(err.value) and "quant:***@" in str(err.value)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_malformed_url_and_missing_sqlite_folder(tmp_path) -> None:
    with pytest.raises(StorageError, match="not a database URL"):
        open_storage("no-scheme-here")
    with pytest.raises(StorageError, match="Cannot open the storage"):
        open_storage(f"sqlite:///{tmp_path}/no/such/folder/study.db")


def test_artifacts_go_beside_an_sqlite_file(tmp_path) -> None:
    assert default_artifact_dir(open_storage(f"sqlite:///{tmp_path}/s.db")) == tmp_path / "s-artifacts"
    memory = optuna.storages.InMemoryStorage()
    assert open_storage(memory) is memory
    assert default_artifact_dir(memory) == Path(DEFAULT_ARTIFACT_DIR)


@pytest.mark.postgres
def test_a_database_server_has_no_file_to_put_artifacts_beside(postgres_url) -> None:
    storage = open_storage(postgres_url)
    assert sqlite_file(storage) is None
    assert default_artifact_dir(storage) == Path(DEFAULT_ARTIFACT_DIR)
