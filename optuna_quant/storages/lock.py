"""The lock every worker of a study shares, wherever it runs, and the storages that have one.

Each storage gets a lock that a killed worker cannot keep:

=============================  ==================================================================
storage                        lock
=============================  ==================================================================
PostgreSQL                     a transaction-level advisory lock, released with its transaction
MySQL, MariaDB                 a named lock (``GET_LOCK``), released with its connection
SQLite file                    a file lock beside the database file, released with its process
journal file, gRPC proxy       a lease in the study's own records (:class:`~.lease.LeaseLock`),
                               taken over once its holder stopped renewing it
in memory                      a lock of this process: no other process can open the storage
=============================  ==================================================================

Any other storage is refused (:class:`UnsupportedStorageError`) before anything is stored: a
lock of this process alone would let workers on two machines run the same trial unnoticed.

A claim of a configuration needs only exclude the claims of the same configuration:
:func:`claim_locks` gives each configuration a lock of its own where named locks cost one
statement (PostgreSQL, MySQL, MariaDB), so that with tens of workers the claims do not queue
behind the study lock; elsewhere every configuration shares the study lock.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from contextlib import AbstractContextManager
from contextlib import contextmanager
import hashlib
import threading

from optuna.storages import BaseStorage
from optuna.storages import GrpcStorageProxy
from optuna.storages import InMemoryStorage
from optuna.storages import JournalStorage
from optuna.storages import RDBStorage
import sqlalchemy
from sqlalchemy.engine import make_url

from optuna_quant._optuna_private import storage_backend
from optuna_quant.storages.heartbeat import Heartbeat
from optuna_quant.storages.lease import LeaseLock
from optuna_quant.storages.rdb import sqlite_file_lock
from optuna_quant.storages.urls import describe
from optuna_quant.storages.urls import SHARED_STORAGES
from optuna_quant.storages.urls import sqlite_file
from optuna_quant.storages.urls import StorageError


StudyLock = Callable[[], AbstractContextManager[None]]
ClaimLocks = Callable[[str], StudyLock]
"""The lock of a configuration, by its key."""


class UnsupportedStorageError(StorageError):
    """A storage whose workers optuna-quant cannot keep apart; raised before anything is stored."""


def in_memory(storage: BaseStorage) -> bool:
    """Whether ``storage`` lives in this process's memory, where no other process can open it."""
    backend = storage_backend(storage)
    if isinstance(backend, RDBStorage):
        url = make_url(backend.url)
        return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")
    return isinstance(backend, InMemoryStorage)


def study_lock(storage: BaseStorage, study_name: str, heartbeat: Heartbeat | None) -> StudyLock:
    """A lock on ``study_name`` that every worker of the study shares, wherever it runs.

    Args:
        storage: The study's storage.
        study_name: The study.
        heartbeat: How long a lease in the storage may go unrenewed (:class:`~.lease.LeaseLock`);
            ``None`` only for a storage :func:`in_memory`.

    Raises:
        UnsupportedStorageError: For a storage that none of the module's locks fits.

    Example:
        >>> import optuna
        >>> lock = study_lock(optuna.storages.InMemoryStorage(), "demo", Heartbeat())
        >>> with lock():
        ...     pass
    """
    if in_memory(storage):
        return _process_lock(study_name)
    backend = storage_backend(storage)
    if isinstance(backend, RDBStorage):
        dialect = make_url(backend.url).get_backend_name()
        if dialect == "postgresql":
            return lambda: _advisory_lock(backend.engine, _lock_key(study_name))
        if dialect in ("mysql", "mariadb"):
            name = "optuna_quant:" + hashlib.sha256(study_name.encode()).hexdigest()[:32]  # 64 characters at most
            return lambda: _named_lock(backend.engine, name)
        database = sqlite_file(backend)
        if database is not None:
            return lambda: sqlite_file_lock(database)
    elif isinstance(backend, (JournalStorage, GrpcStorageProxy)) and heartbeat is not None:
        return LeaseLock(backend, study_name, heartbeat)
    raise UnsupportedStorageError(
        f"Workers on {describe(storage)} cannot be kept from running the same trials: optuna-quant "
        f"has no lock they all share there. Use {SHARED_STORAGES}, or SQLite for workers on one machine."
    )


def claim_locks(storage: BaseStorage, study_name: str, heartbeat: Heartbeat | None) -> ClaimLocks:
    """The lock of each configuration of ``study_name``, by its key: one per key on a database
    that has named locks, else the study lock (:func:`study_lock`) for every key.

    Example:
        >>> import optuna
        >>> locks = claim_locks(optuna.storages.InMemoryStorage(), "demo", Heartbeat())
        >>> with locks("a configuration's key")():
        ...     pass
    """
    lock = study_lock(storage, study_name, heartbeat)
    backend = storage_backend(storage)
    if not in_memory(storage) and isinstance(backend, RDBStorage):
        if make_url(backend.url).get_backend_name() in ("postgresql", "mysql", "mariadb"):
            return lambda key: study_lock(storage, f"{study_name}:optuna_quant:claim:{key}", heartbeat)
    return lambda key: lock


def _process_lock(study_name: str) -> StudyLock:
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
def _named_lock(engine: sqlalchemy.engine.Engine, name: str) -> Iterator[None]:
    # A named lock belongs to its connection's session: the server frees it when a killed
    # worker's connection drops. GET_LOCK says 0 when its timeout passed, NULL on an error.
    with engine.connect() as connection:
        taken = 0
        while taken == 0:
            taken = connection.execute(sqlalchemy.text("SELECT GET_LOCK(:name, 60)"), {"name": name}).scalar()
        if taken != 1:
            raise StorageError(f"GET_LOCK({name!r}) failed on {describe(str(engine.url))}")
        try:
            yield
        finally:
            connection.execute(sqlalchemy.text("SELECT RELEASE_LOCK(:name)"), {"name": name})
