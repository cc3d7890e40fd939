"""The lock every worker of a study shares, wherever it runs."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from contextlib import AbstractContextManager
from contextlib import contextmanager
import hashlib
from pathlib import Path
import threading

from optuna.storages import BaseStorage
from optuna.storages import RDBStorage
import sqlalchemy
from sqlalchemy.engine import make_url

from optuna_quant.storages.urls import sqlite_file


StudyLock = Callable[[], AbstractContextManager[None]]


def study_lock(storage: BaseStorage, study_name: str) -> StudyLock:
    """A lock on ``study_name`` that every worker of the study shares, wherever it runs.

    PostgreSQL gives a transaction-level advisory lock (released even if the worker is killed),
    SQLite a file lock beside the database file; any other storage a lock of this process only.

    Example:
        >>> import optuna
        >>> lock = study_lock(optuna.storages.InMemoryStorage(), "demo")
        >>> with lock():
        ...     pass
    """
    if isinstance(storage, RDBStorage) and make_url(storage.url).get_backend_name() == "postgresql":
        return lambda: _advisory_lock(storage.engine, _lock_key(study_name))
    database = sqlite_file(storage)
    if database is not None:
        return lambda: sqlite_file_lock(database)
    with _PROCESS_LOCKS_GUARD:
        lock = _PROCESS_LOCKS.setdefault(study_name, threading.Lock())
    return lambda: lock


_PROCESS_LOCKS: dict[str, threading.Lock] = {}
_PROCESS_LOCKS_GUARD = threading.Lock()


def _lock_key(study_name: str) -> int:
    # Advisory locks take a signed 64-bit key; a digest keeps study names apart.
    return int.from_bytes(hashlib.sha256(study_name.encode()).digest()[:8], "big", signed=True)


@contextmanager
def _advisory_lock(engine: sqlalchemy.engine.Engine, key: int) -> Iterator[None]:
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
        yield


@contextmanager
def sqlite_file_lock(database: Path) -> Iterator[None]:
    """An exclusive lock on the file ``<database>.lock`` beside an SQLite database, across processes."""
    import fcntl  # POSIX only: imported here so that the module loads everywhere

    with open(database.with_suffix(database.suffix + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
