"""Opening the storage a study lives in, with Optuna's heartbeat on every database.

The default is an embedded SQLite file. Any Optuna RDB URL works, SQLite included, and every one
runs Optuna's heartbeat: a trial whose worker died is marked failed after ``grace_period`` seconds
and queued again (:class:`optuna.storages.RetryHeartbeatStaleTrialCallback`), to be run by another
worker. A storage that cannot be reached is an error that names its URL (password masked) before
anything is written.

Example:
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> storage = open_storage(f"sqlite:///{folder}/study.db", heartbeat_interval=5, grace_period=15)
    >>> heartbeat_interval(storage), grace_period(storage)
    (5, 15)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from contextlib import contextmanager
from contextlib import nullcontext
from pathlib import Path
import time
from typing import Any
import warnings

import optuna
from optuna.storages import BaseStorage
from optuna.storages import RDBStorage
from optuna.storages import RetryHeartbeatStaleTrialCallback
import sqlalchemy
from sqlalchemy.engine import make_url

from optuna_quant.storages.lock import sqlite_file_lock
from optuna_quant.storages.urls import masked_url
from optuna_quant.storages.urls import sqlite_file


DEFAULT_STORAGE = "sqlite:///optuna_quant.db"
HEARTBEAT_INTERVAL = 10
GRACE_PERIOD = 30
MAX_RETRY = 3
ARTIFACT_DIR_SUFFIX = "-artifacts"
DEFAULT_ARTIFACT_DIR = "optuna_quant" + ARTIFACT_DIR_SUFFIX
SQLITE_BUSY_SECONDS = 60.0
_CREATE_ATTEMPTS = 5


class StorageError(ValueError):
    """A storage that cannot be opened; the message names its URL with the password masked."""


def open_storage(
    storage: str | BaseStorage | None = None,
    *,
    heartbeat_interval: int = HEARTBEAT_INTERVAL,
    grace_period: int = GRACE_PERIOD,
    max_retry: int = MAX_RETRY,
) -> BaseStorage:
    """The storage of a study: ``storage`` itself when it is a storage object, else its URL opened.

    Every RDB storage, SQLite included, gets Optuna's heartbeat: every ``heartbeat_interval``
    seconds a running trial says it is alive; one silent for ``grace_period`` seconds is marked
    failed and queued again (at most ``max_retry`` times), so a killed worker loses no trial and
    holds no place in the budget for ever. Another storage object is returned as it is.

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
        parsed = make_url(url)
    except (sqlalchemy.exc.ArgumentError, ValueError) as err:  # ValueError: a port that is no number
        raise StorageError(f"Storage URL {masked_url(url)!r} is not a database URL: {err}") from err
    options: dict[str, Any] = {}
    sqlite = parsed.get_backend_name() == "sqlite"
    in_memory = sqlite and parsed.database in (None, "", ":memory:")
    if sqlite and "timeout" not in parsed.query:
        # Workers and their heartbeat threads write to one file: a writer waits for the file's
        # lock up to this long (Python's default, 5 s, is short on a busy machine).
        options["engine_kwargs"] = {"connect_args": {"timeout": SQLITE_BUSY_SECONDS}}
    # Optuna's heartbeat thread opens its own connection: an in-memory database has none to share.
    if not in_memory:
        options.update(
            heartbeat_interval=heartbeat_interval,
            grace_period=grace_period,
            heartbeat_stale_trial_callback=_retry(max_retry),
        )
    try:
        with _creation_lock(url):
            storage = _rdb_storage(url, options)
        if sqlite and not in_memory:  # an in-memory database lives in its one connection: kept
            _immediate_transactions(storage.engine)
        return storage
    except (ImportError, sqlalchemy.exc.SQLAlchemyError) as err:
        reason = getattr(err, "orig", None) or err
        raise StorageError(f"Cannot open the storage {masked_url(url)!r}: {reason}".strip()) from err


def _immediate_transactions(engine: sqlalchemy.engine.Engine) -> None:
    """Begin every SQLite transaction with ``BEGIN IMMEDIATE``.

    Optuna reads, then writes, in one transaction (the heartbeat does). Under SQLite's default
    deferred transactions two such writers deadlock, and SQLite fails one at once with "database
    is locked" instead of letting it wait: a worker and its own heartbeat thread are enough.
    Taking the write lock first makes each one wait its turn (up to ``SQLITE_BUSY_SECONDS``).
    SQLAlchemy's recipe for pysqlite: see its "Serializable isolation / Savepoints" notes.
    """

    @sqlalchemy.event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_connection: Any, _: Any) -> None:
        dbapi_connection.isolation_level = None

    @sqlalchemy.event.listens_for(engine, "begin")
    def _begin_immediate(connection: sqlalchemy.engine.Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # connections opened before the listeners get them when reopened


def _creation_lock(url: str) -> AbstractContextManager[None]:
    # Workers that open a fresh SQLite file together would race to create Optuna's tables. A
    # folder that does not exist has no lock file: SQLite's own error names the database then.
    database = sqlite_file(url)
    if database is None or not database.parent.is_dir():
        return nullcontext()
    return sqlite_file_lock(database)


def _rdb_storage(url: str, options: dict[str, Any]) -> RDBStorage:
    attempt = 1
    while True:
        try:
            with optuna_warnings_off():
                return RDBStorage(url, **options)
        except sqlalchemy.exc.DBAPIError as err:
            # Workers that open a fresh database server together race to create Optuna's tables;
            # the loser finds them made on its next attempt.
            if attempt == _CREATE_ATTEMPTS or not _lost_creation_race(err):
                raise
            time.sleep(0.2 * attempt)
            attempt += 1


def _lost_creation_race(err: sqlalchemy.exc.DBAPIError) -> bool:
    # PostgreSQL reports a table made meanwhile as an integrity or programming error, MySQL as
    # an operational one ("Table ... already exists"); an unreachable server is no race.
    return isinstance(err, (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError)) or "already exists" in str(err)


def heartbeat_interval(storage: BaseStorage) -> int | None:
    """Seconds between heartbeats of ``storage``, or ``None`` where it runs no heartbeat."""
    return storage.get_heartbeat_interval() if isinstance(storage, RDBStorage) else None


def grace_period(storage: BaseStorage) -> int | None:
    """Seconds without a heartbeat after which ``storage`` fails a running trial, or ``None``
    where it runs no heartbeat (Optuna's default grace is two intervals)."""
    interval = heartbeat_interval(storage)
    if interval is None:
        return None
    assert isinstance(storage, RDBStorage)
    return storage.grace_period or 2 * interval


def default_artifact_dir(storage: BaseStorage, given: str | Path | None = None) -> Path:
    """Where the best models are stored: ``given``, else beside an SQLite file
    (``<name>-artifacts``), else here."""
    if given is not None:
        return Path(given)
    database = sqlite_file(storage)
    if database is None:
        return Path(DEFAULT_ARTIFACT_DIR)
    return database.with_name(database.stem + ARTIFACT_DIR_SUFFIX)


@contextmanager
def optuna_warnings_off() -> Iterator[None]:
    """Silence Optuna's experimental-feature warnings (heartbeat, metric names, stale trials)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def _retry(max_retry: int) -> RetryHeartbeatStaleTrialCallback:
    with optuna_warnings_off():
        return RetryHeartbeatStaleTrialCallback(max_retry=max_retry)



