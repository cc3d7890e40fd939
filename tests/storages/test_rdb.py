"""Opening a storage: errors that name it (its password masked) before anything is stored, and the
heartbeat on every database."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

import optuna_quant as oq
from optuna_quant._optuna_private import stop_orphan_heartbeats
from optuna_quant.storages.rdb import DEFAULT_ARTIFACT_DIR
from optuna_quant.storages.rdb import default_artifact_dir
from optuna_quant.storages.rdb import GRACE_PERIOD
from optuna_quant.storages.rdb import grace_period
from optuna_quant.storages.rdb import HEARTBEAT_INTERVAL
from optuna_quant.storages.rdb import heartbeat_interval
from optuna_quant.storages.rdb import open_storage
from optuna_quant.storages.rdb import StorageError
from optuna_quant.storages.urls import sqlite_file
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


def test_heartbeat_on_every_database_sqlite_included(tmp_path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path}/s.db", heartbeat_interval=2, grace_period=5)
    assert (heartbeat_interval(storage), grace_period(storage)) == (2, 5)
    # An in-memory database has no second connection for Optuna's heartbeat thread.
    assert heartbeat_interval(open_storage("sqlite:///:memory:")) is None
    assert default_artifact_dir(open_storage(f"sqlite:///{tmp_path}/s.db")) == tmp_path / "s-artifacts"
    memory = optuna.storages.InMemoryStorage()
    assert open_storage(memory) is memory


def test_a_heartbeat_thread_whose_exit_was_skipped_is_stopped(tmp_path) -> None:
    # As after a Ctrl-C inside Optuna's heartbeat entry: started, never exited. Non-daemon, it
    # would keep the process alive, and the trial's heartbeat would never stop.
    storage = open_storage(f"sqlite:///{tmp_path}/s.db", heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(storage=storage)
    trial = study.ask()
    optuna.storages._heartbeat.get_heartbeat_thread(trial._trial_id, storage).start()
    assert stop_orphan_heartbeats() == 1
    assert stop_orphan_heartbeats() == 0


@pytest.mark.postgres
def test_heartbeat_on_a_database_server(postgres_url) -> None:
    storage = open_storage(postgres_url)
    assert (heartbeat_interval(storage), grace_period(storage)) == (HEARTBEAT_INTERVAL, GRACE_PERIOD)
    assert heartbeat_interval(open_storage(postgres_url, heartbeat_interval=3)) == 3
    assert sqlite_file(storage) is None
    assert default_artifact_dir(storage) == Path(DEFAULT_ARTIFACT_DIR)  # no file to put them beside
