"""Opening a storage from its URL: a journal file and Optuna's gRPC proxy beside the databases, each
an error naming it when it cannot be opened."""

from __future__ import annotations

import optuna
import pytest

from optuna_quant.storages import factory
from optuna_quant.storages.factory import open_storage
from optuna_quant.storages.urls import StorageError
from optuna_quant.testing.postgres import free_port


def test_a_journal_url_opens_a_journal_file(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    storage = open_storage("journal:runs.log")
    assert isinstance(storage, optuna.storages.JournalStorage) and (tmp_path / "runs.log").is_file()
    optuna.create_study(storage=storage, study_name="s")
    assert optuna.load_study(study_name="s", storage=open_storage(f"journal:{tmp_path}/runs.log")).study_name == "s"
    with pytest.raises(StorageError, match="Cannot open the storage 'journal:no/such/folder/s.log'"):
        open_storage("journal:no/such/folder/s.log")


@pytest.mark.postgres
def test_a_grpc_url_opens_optunas_proxy(grpc_url) -> None:
    storage = open_storage(grpc_url)
    assert isinstance(storage, optuna.storages.GrpcStorageProxy)
    optuna.create_study(storage=storage, study_name="through-the-proxy")
    assert "through-the-proxy" in optuna.get_all_study_names(storage=open_storage(grpc_url))


def test_a_grpc_proxy_that_does_not_answer_is_named(monkeypatch) -> None:
    monkeypatch.setattr(factory, "GRPC_READY_SECONDS", 0.5)
    url = f"grpc://127.0.0.1:{free_port()}"
    with pytest.raises(StorageError, match=f"Cannot open the storage '{url}': no gRPC proxy answered"):
        open_storage(url)
