"""Opening the storage a study lives in, and the lock its workers share.

The default is an embedded SQLite file. Any Optuna RDB URL works; for a database server
(PostgreSQL, MySQL: every URL but ``sqlite``) the storage runs Optuna's heartbeat, so a trial
whose worker died is marked failed after ``grace_period`` seconds and run again by another
worker. A storage that cannot be reached is an error that names its URL (password masked)
before anything is written.

Example:
    >>> storage = open_storage("sqlite:///:memory:")
    >>> heartbeat_interval(storage) is None
    True
    >>> masked_url("postgresql://quant:secret@db.example.com/studies")
    'postgresql://quant:***@db.example.com/studies'
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from contextlib import contextmanager
import hashlib
from pathlib import Path
import re
import threading
import time
from typing import Any
import warnings

import optuna
from optuna.storages import BaseStorage
from optuna.storages import RDBStorage
from optuna.storages import RetryHeartbeatStaleTrialCallback
import sqlalchemy
from sqlalchemy.engine import make_url

DEFAULT_STORAGE = "sqlite:///optuna_quant.db"
HEARTBEAT_INTERVAL = 10
GRACE_PERIOD = 30
MAX_RETRY = 3
ARTIFACT_DIR_SUFFIX = "-artifacts"
DEFAULT_ARTIFACT_DIR = "optuna_quant" + ARTIFACT_DIR_SUFFIX
_CREATE_ATTEMPTS = 5

StudyLock = Callable[[], AbstractContextManager[None]]


class StorageError(ValueError):
    """A storage that cannot be opened; the message names its URL with the password masked."""


def masked_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, fit for a log line or an error."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def describe(storage: str | BaseStorage) -> str:
    """A short, password-free name of ``storage`` for messages."""
    if isinstance(storage, str):
        return masked_url(storage)
    if isinstance(storage, RDBStorage):
        return masked_url(storage.url)
    return type(storage).__name__


def open_storage(
    storage: str | BaseStorage | None = None,
    *,
    heartbeat_interval: int = HEARTBEAT_INTERVAL,
    grace_period: int = GRACE_PERIOD,
    max_retry: int = MAX_RETRY,
) -> BaseStorage:
    """The storage of a study: ``storage`` itself when it is a storage object, else its URL opened.

    A database server gets Optuna's heartbeat: every ``heartbeat_interval`` seconds a running
    trial says it is alive; one silent for ``grace_period`` seconds is marked failed and queued
    again (at most ``max_retry`` times), so a killed worker loses no trial. SQLite gets none: it
    serves one machine, where a worker is best stopped with Ctrl-C.

    Args:
        storage: An Optuna storage URL, a storage object, or ``None`` for :data:`DEFAULT_STORAGE`.
        heartbeat_interval: Seconds between two heartbeats of a running trial.
        grace_period: Seconds of silence after which a running trial counts as dead.
        max_retry: How many times a trial whose worker died is run again.

    Raises:
        StorageError: If the URL is malformed, its driver is missing, or the database cannot be
            reached.
    """
    if isinstance(storage, BaseStorage):
        return storage
    url = DEFAULT_STORAGE if storage is None else storage
    try:
        dialect = make_url(url).get_backend_name()
    except sqlalchemy.exc.ArgumentError as err:
        raise StorageError(f"Storage URL {masked_url(url)!r} is not a database URL: {err}") from err
    heartbeat: dict[str, Any] = {}
    if dialect != "sqlite":
        heartbeat = {
            "heartbeat_interval": heartbeat_interval,
            "grace_period": grace_period,
            "heartbeat_stale_trial_callback": _retry(max_retry),
        }
    try:
        return _rdb_storage(url, heartbeat)
    except (ImportError, sqlalchemy.exc.SQLAlchemyError) as err:
        reason = getattr(err, "orig", None) or err
        raise StorageError(f"Cannot open the storage {masked_url(url)!r}: {reason}".strip()) from err


def _rdb_storage(url: str, options: dict[str, Any]) -> RDBStorage:
    attempt = 1
    while True:
        try:
            with optuna_warnings_off():
                return RDBStorage(url, **options)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
            # Workers that open a fresh database together race to create Optuna's tables; the
            # loser finds them made on its next attempt.
            if attempt == _CREATE_ATTEMPTS:
                raise
            time.sleep(0.2 * attempt)
            attempt += 1


def sqlite_file(storage: str | BaseStorage) -> Path | None:
    """The database file of an SQLite storage, given as a URL or opened; else ``None``.

    Another database, an in-memory SQLite database, a malformed URL and a storage that is not an
    RDB storage have no file. The path is SQLAlchemy's reading of the URL (percent-escapes
    decoded), so it names the file that the storage opens.

    Example:
        >>> sqlite_file("sqlite:///runs/study.db").name
        'study.db'
        >>> sqlite_file("sqlite:///:memory:") is None
        True
    """
    url = storage.url if isinstance(storage, RDBStorage) else storage
    if not isinstance(url, str):
        return None
    try:
        parsed = make_url(url)
    except sqlalchemy.exc.ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def heartbeat_interval(storage: BaseStorage) -> int | None:
    """Seconds between heartbeats of ``storage``, or ``None`` where it runs no heartbeat."""
    return storage.heartbeat_interval if isinstance(storage, RDBStorage) else None


def default_artifact_dir(storage: BaseStorage, given: str | Path | None = None) -> Path:
    """Where the best models are stored: ``given``, else beside an SQLite file
    (``<name>-artifacts``), else here."""
    if given is not None:
        return Path(given)
    database = sqlite_file(storage)
    if database is None:
        return Path(DEFAULT_ARTIFACT_DIR)
    return database.with_name(database.stem + ARTIFACT_DIR_SUFFIX)


def study_lock(storage: BaseStorage, study_name: str) -> StudyLock:
    """A lock on ``study_name`` that every worker of the study shares, wherever it runs.

    PostgreSQL gives a transaction-level advisory lock (released even if the worker is killed),
    SQLite a file lock beside the database file; any other storage a lock of this process only.

    Example:
        >>> lock = study_lock(optuna.storages.InMemoryStorage(), "demo")
        >>> with lock():
        ...     pass
    """
    if isinstance(storage, RDBStorage) and make_url(storage.url).get_backend_name() == "postgresql":
        return lambda: _advisory_lock(storage.engine, _lock_key(study_name))
    database = sqlite_file(storage)
    if database is not None:
        path = database.with_suffix(database.suffix + ".lock")
        return lambda: _file_lock(path)
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
def _file_lock(path: Path) -> Iterator[None]:
    import fcntl  # POSIX only: imported here so that the module loads everywhere

    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def optuna_warnings_off() -> Iterator[None]:
    """Silence Optuna's experimental-feature warnings (heartbeat, metric names, stale trials)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def _retry(max_retry: int) -> RetryHeartbeatStaleTrialCallback:
    with optuna_warnings_off():
        return RetryHeartbeatStaleTrialCallback(max_retry=max_retry)
