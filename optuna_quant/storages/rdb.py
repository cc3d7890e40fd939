"""Opening a database URL as Optuna's RDB storage, so that many workers can open it together.

Workers that open a fresh database together race to create Optuna's tables: on SQLite under a
file lock beside the database file, on a server by trying again. SQLite transactions begin with
``BEGIN IMMEDIATE``, so that workers and their heartbeat threads queue for the file instead of
failing with "database is locked".

Example:
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> open_rdb(f"sqlite:///{folder}/study.db").url.endswith("study.db")
    True
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
import sqlalchemy
from sqlalchemy.engine import make_url

from optuna_quant.storages.urls import masked_url
from optuna_quant.storages.urls import sqlite_file
from optuna_quant.storages.urls import StorageError


DEFAULT_STORAGE = "sqlite:///optuna_quant.db"
ARTIFACT_DIR_SUFFIX = "-artifacts"
DEFAULT_ARTIFACT_DIR = "optuna_quant" + ARTIFACT_DIR_SUFFIX
SQLITE_BUSY_SECONDS = 60.0
_CREATE_ATTEMPTS = 5


def open_rdb(url: str) -> RDBStorage:
    """Optuna's RDB storage of the database ``url``, its tables created if need be.

    Raises:
        StorageError: If its driver is missing or the database cannot be reached.
    """
    parsed = make_url(url)
    options: dict[str, Any] = {}
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite and "timeout" not in parsed.query:
        # Workers and their heartbeat threads write to one file: a writer waits for the file's
        # lock up to this long (Python's default, 5 s, is short on a busy machine).
        options["engine_kwargs"] = {"connect_args": {"timeout": SQLITE_BUSY_SECONDS}}
    try:
        with _creation_lock(url):
            storage = _rdb_storage(url, options)
        if sqlite and parsed.database not in (None, "", ":memory:"):  # a memory database lives in its one connection
            _immediate_transactions(storage.engine)
        return storage
    except (ImportError, sqlalchemy.exc.SQLAlchemyError) as err:
        reason = getattr(err, "orig", None) or err
        raise StorageError(f"Cannot open the storage {masked_url(url)!r}: {reason}".strip()) from err


def _immediate_transactions(engine: sqlalchemy.engine.Engine) -> None:
    """Begin every SQLite transaction with ``BEGIN IMMEDIATE``.

    Optuna reads, then writes, in one transaction. Under SQLite's default deferred transactions
    two such writers deadlock, and SQLite fails one at once with "database is locked" instead of
    letting it wait: a worker and its own heartbeat thread are enough. Taking the write lock first
    makes each one wait its turn (up to ``SQLITE_BUSY_SECONDS``). SQLAlchemy's recipe for
    pysqlite: see its "Serializable isolation / Savepoints" notes.
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
    """Silence Optuna's experimental-feature warnings (gRPC proxy, metric names, retried trials)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield
