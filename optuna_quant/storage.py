"""Opening the storage a study lives in, and the lock its workers share.

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
    >>> masked_url("postgresql://quant:secret@db.example.com/studies")
    'postgresql://quant:***@db.example.com/studies'
    >>> masked_url("quant:p@ss@db.example.com/studies?password=p@ss")
    'quant:***@db.example.com/studies?password=***'
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from contextlib import contextmanager
import datetime
import hashlib
import logging
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

from optuna_quant._optuna_private import fail_never_beaten
from optuna_quant._optuna_private import study_storage

DEFAULT_STORAGE = "sqlite:///optuna_quant.db"
HEARTBEAT_INTERVAL = 10
GRACE_PERIOD = 30
MAX_RETRY = 3
ARTIFACT_DIR_SUFFIX = "-artifacts"
DEFAULT_ARTIFACT_DIR = "optuna_quant" + ARTIFACT_DIR_SUFFIX
POLL_SECONDS = 0.5
SQLITE_BUSY_SECONDS = 60.0
_CREATE_ATTEMPTS = 5
_logger = logging.getLogger("optuna_quant")

StudyLock = Callable[[], AbstractContextManager[None]]


class StorageError(ValueError):
    """A storage that cannot be opened; the message names its URL with the password masked."""


_QUERY_PASSWORD = re.compile(r"([?&](?:password|passwd|pwd)=)[^&]*", re.IGNORECASE)


def masked_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, fit for a log line or an error.

    The URL need not parse: a password before the host (``user:pw@host``, with or without a
    scheme, even holding an unescaped ``@``) and one in the query (``?password=pw``) are masked.

    Example:
        >>> masked_url("postgresql://quant:p@ss@db/studies")
        'postgresql://quant:***@db/studies'
        >>> masked_url("sqlite:///runs/a@b/study.db")
        'sqlite:///runs/a@b/study.db'
    """
    address, mark, query = url.partition("?")
    query = _QUERY_PASSWORD.sub(r"\1***", mark + query)
    # The host follows the last "@": a password may hold "@", a host name may not.
    credentials, at, host = address.rpartition("@")
    scheme, sep, userinfo = credentials.rpartition("://")
    if at and ":" in userinfo and "/" not in userinfo.split(":", 1)[0]:
        user = userinfo.split(":", 1)[0]
        address = f"{scheme}{sep}{user}:***@{host}"
    return address + query


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


class Waiter:
    """Waits on the trials of other workers, each wait bounded by Optuna's heartbeat.

    The caller looks again under the study lock after every beat, failing the trials whose
    heartbeat stopped for the storage's grace period first (:func:`fail_stale_trials`), so a wait
    on a dead worker's trial ends after that grace period; on a live worker's, when its trial
    ends. The total of a wait is logged when it ends.

    Args:
        poll_seconds: Seconds between two looks.

    Example:
        >>> waiter = Waiter(poll_seconds=0.01)
        >>> waiter.beat("trial 3")
        >>> waiter.waiting, waiter.waited > 0
        (True, True)
        >>> waiter.done()
        >>> waiter.waiting
        False
    """

    def __init__(self, poll_seconds: float = POLL_SECONDS) -> None:
        self.poll_seconds = poll_seconds
        self.what: str | None = None
        self.since = 0.0

    @property
    def waiting(self) -> bool:
        """Whether a wait is under way (a beat since the last :meth:`done`)."""
        return self.what is not None

    @property
    def waited(self) -> float:
        """Seconds of the wait under way (0 when none is)."""
        return time.monotonic() - self.since if self.waiting else 0.0

    def beat(self, what: str) -> None:
        """Wait one poll for ``what``."""
        if self.what is None:
            self.what, self.since = what, time.monotonic()
            _logger.info("Waiting for %s.", what)
        time.sleep(self.poll_seconds)

    def done(self) -> None:
        """End the wait under way, logging how long it took."""
        if self.what is not None:
            _logger.info("Waited %.1f s for %s.", self.waited, self.what)
            self.what = None


def fail_stale_trials(study: optuna.Study, *, never_beaten: bool = True) -> None:
    """Fail (and queue again) the running trials whose worker stopped beating; see Optuna's.

    With ``never_beaten``, also those that never beat and started more than the grace period ago
    (one more storage transaction: a worker asks for it while it waits). Optuna skips a trial
    without a heartbeat, and a worker SIGKILLed after Optuna's ask created its trial, before the
    first heartbeat (the sampler's ``before_trial`` runs in between), left one running for ever:
    every other worker waited on it once the budget was used. A worker asks and writes that first
    heartbeat under the study lock, so no live worker of optuna-quant is in between while the
    caller holds it; the grace period spares a trial that an Optuna process outside optuna-quant's
    workers is still asking for. The trial's start is stamped by the asking machine's clock and
    compared with this one's: a clock ahead of this one's delays the failure by as much.

    Call it under the study lock: between failing a trial and queueing its retry, a worker that
    decided from the study's trials would see neither (it once queued a second reference).
    """
    with optuna_warnings_off():
        optuna.storages.fail_stale_trials(study)
        grace = grace_period(study_storage(study))
        if never_beaten and grace is not None:
            fail_never_beaten(study, started_before=datetime.datetime.now() - datetime.timedelta(seconds=grace))
