"""Storage URLs: a password masked in every form, the SQLite file behind a URL or a storage, and the
URLs of a journal file and of a gRPC proxy."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

import optuna_quant as oq
from optuna_quant.storages.factory import open_storage
from optuna_quant.storages.heartbeat import Heartbeat
from optuna_quant.storages.lock import study_lock
from optuna_quant.storages.urls import grpc_address
from optuna_quant.storages.urls import journal_file
from optuna_quant.storages.urls import masked_url
from optuna_quant.storages.urls import sqlite_file
from optuna_quant.storages.urls import StorageError


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://quant:s3cret@db.example.com/studies",
        "quant:s3cret@db.example.com/studies",  # no scheme
        "postgresql://quant@db.example.com/studies?password=s3cret&sslmode=off",
        "postgresql://quant:s3c@ret@db.example.com/studies",  # an unescaped "@" in the password
        "postgresql+psycopg2://quant:s3c@ret@db.example.com/studies",  # the form people paste
        "mysql+pymysql://quant:s3c@r:et@db.example.com:3306/studies",
        "mysql+pymysql://quant:s3c/r:et@db.example.com:3306/studies",
        "postgresql://quant:s3c%r:et@db.example.com/studies",  # a "%" that escapes nothing
    ],
)
def test_password_is_masked_in_every_form(tmp_path, monkeypatch, calib, agreement, url) -> None:
    parts = ("s3c", "ret", "r:et", "et@")  # no piece of any password above
    masked = masked_url(url)
    assert not any(part in masked for part in parts) and "***" in masked and "db.example.com" in masked
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageError) as err:  # a real attempt to open it: the error names it masked
        oq.create_study(tmp_path / "missing.onnx", calib, agreement, storage=url.replace("db.example.com", "127.0.0.1"))
    assert not any(part in str(err.value) for part in parts), str(err.value)


def test_an_unescaped_at_in_the_password_is_refused_before_connecting_saying_how_to_escape_it() -> None:
    with pytest.raises(StorageError, match="unescaped '@'; write it as %40") as err:
        open_storage("postgresql+psycopg2://user:Xq7@Zk9@127.0.0.1:1/db")
    assert "Xq7" not in str(err.value) and "Zk9" not in str(err.value)


def test_sqlite_file_of_urls_and_storages(tmp_path) -> None:
    assert sqlite_file(f"sqlite:///{tmp_path}/s.db") == tmp_path / "s.db"
    assert sqlite_file("sqlite+pysqlite:///rel/s.db?timeout=5") == Path("rel/s.db")
    assert sqlite_file(f"sqlite:///{tmp_path}/a%20b.db") == tmp_path / "a b.db"  # as SQLAlchemy opens it
    for url in ("sqlite://", "sqlite:///:memory:", "postgresql://u:p@db/optuna", "no-scheme-here"):
        assert sqlite_file(url) is None
    assert sqlite_file(open_storage(f"sqlite:///{tmp_path}/s.db")) == tmp_path / "s.db"
    assert sqlite_file(optuna.storages.InMemoryStorage()) is None
    with study_lock(open_storage(f"sqlite:///{tmp_path}/s.db"), "s", Heartbeat())():
        assert (tmp_path / "s.db.lock").is_file()


def test_journal_and_grpc_urls() -> None:
    assert journal_file("journal:runs/s.log") == Path("runs/s.log")
    assert journal_file("journal:/shared/s.log") == Path("/shared/s.log")
    assert journal_file("sqlite:///s.db") is None and grpc_address("journal:s.log") is None
    assert grpc_address("grpc://127.0.0.1:13000/") == ("127.0.0.1", 13000)
    for url in ("grpc://proxy", "grpc://proxy:port"):
        with pytest.raises(StorageError, match="grpc://HOST:PORT"):
            grpc_address(url)
