"""Opening the storage a study lives in, from its URL.

=====================================  =========================================================
URL                                    storage
=====================================  =========================================================
``sqlite:///study.db`` (the default)   Optuna's RDB storage on an SQLite file: one machine
``postgresql://user@host/db``,         Optuna's RDB storage on a database server
``mysql+pymysql://user@host/db``
``journal:/shared/study.log``          Optuna's journal storage, a log file on a shared file system
``grpc://host:13000``                  Optuna's gRPC proxy (``run_grpc_proxy_server``) in front of
                                       a database
=====================================  =========================================================

A storage that cannot be reached is an error naming it (password masked) before anything is
written, and so is a URL of another kind: optuna-quant keeps workers apart on these storages
only (:mod:`optuna_quant.storages.lock`).

Example:
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> type(open_storage(f"journal:{folder}/study.log")).__name__
    'JournalStorage'
    >>> open_storage("redis://localhost:6379")
    Traceback (most recent call last):
    ...
    optuna_quant.storages.urls.StorageError: Storage URL 'redis://localhost:6379' is no storage optuna-quant's workers can share: ...
"""

from __future__ import annotations

from optuna.storages import BaseStorage
from optuna.storages import GrpcStorageProxy
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal import JournalFileSymlinkLock
import sqlalchemy
from sqlalchemy.engine import make_url

from optuna_quant.storages.heartbeat import GRACE_PERIOD
from optuna_quant.storages.rdb import DEFAULT_STORAGE
from optuna_quant.storages.rdb import open_rdb
from optuna_quant.storages.rdb import optuna_warnings_off
from optuna_quant.storages.urls import grpc_address
from optuna_quant.storages.urls import journal_file
from optuna_quant.storages.urls import masked_url
from optuna_quant.storages.urls import SHARED_STORAGES
from optuna_quant.storages.urls import StorageError


DATABASES = ("sqlite", "postgresql", "mysql", "mariadb")
"""The databases whose workers share a lock of the database (:mod:`optuna_quant.storages.lock`)."""
GRPC_READY_SECONDS = 10.0


def open_storage(storage: str | BaseStorage | None = None, *, grace_period: int = GRACE_PERIOD) -> BaseStorage:
    """The storage of a study: ``storage`` itself when it is a storage object, else its URL opened.

    Args:
        storage: A storage URL of the module's table, a storage object, or ``None`` for
            :data:`~optuna_quant.storages.rdb.DEFAULT_STORAGE`.
        grace_period: Seconds after which a journal file's write lock, held by a worker that
            died, is taken over: the same silence after which its trial is.

    Raises:
        StorageError: If the URL is malformed (an unescaped ``@`` in its password among them) or
            of another kind, its driver is missing, or the storage cannot be reached; its
            message never holds the password.
    """
    if isinstance(storage, BaseStorage):
        return storage
    url = DEFAULT_STORAGE if storage is None else storage
    path = journal_file(url)
    if path is not None:
        return _open_journal(url, str(path), grace_period)
    address = grpc_address(url)
    if address is not None:
        return _open_proxy(url, *address)
    try:
        parsed = make_url(url)
        dialect = parsed.get_backend_name()
    except sqlalchemy.exc.ArgumentError as err:
        raise StorageError(f"Storage URL {masked_url(url)!r} is not a database URL: {err}") from err
    except ValueError as err:  # a port that is no number; its message may quote a piece of the password
        raise StorageError(
            f"Storage URL {masked_url(url)!r} is not a database URL: its port is no number, or its user "
            "name or password holds an unescaped ':', '@' or '/' (write them as %3A, %40, %2F)."
        ) from err
    if "@" in (parsed.host or ""):
        # SQLAlchemy splits at the first "@": the rest of the password would reach the driver,
        # and its error message, as part of the host name.
        raise StorageError(
            f"Storage URL {masked_url(url)!r}: its user name or password holds an unescaped '@'; "
            "write it as %40 (urllib.parse.quote(password, safe='') escapes every such character)."
        )
    if dialect not in DATABASES:
        raise StorageError(
            f"Storage URL {masked_url(url)!r} is no storage optuna-quant's workers can share: use "
            f"{SHARED_STORAGES}, or SQLite for workers on one machine."
        )
    return open_rdb(url)


def _open_journal(url: str, path: str, grace_period: int) -> JournalStorage:
    # Optuna's journal takes a file lock for each write; one that a killed worker left is taken
    # over after the grace period, as that worker's trial is, not after Optuna's 30 s.
    try:
        with optuna_warnings_off():
            return JournalStorage(JournalFileBackend(path, lock_obj=JournalFileSymlinkLock(path, grace_period)))
    except OSError as err:
        raise StorageError(f"Cannot open the storage {url!r}: {err}") from err


def _open_proxy(url: str, host: str, port: int) -> GrpcStorageProxy:
    try:
        with optuna_warnings_off():
            proxy = GrpcStorageProxy(host=host, port=port)
            proxy.wait_server_ready(timeout=GRPC_READY_SECONDS)
    except ImportError as err:
        raise StorageError(f"Cannot open the storage {masked_url(url)!r}: {err} (pip install grpcio protobuf)") from err
    except ConnectionError as err:
        raise StorageError(
            f"Cannot open the storage {masked_url(url)!r}: no gRPC proxy answered within {GRPC_READY_SECONDS:.0f} s "
            f"(start it with optuna.storages.run_grpc_proxy_server)"
        ) from err
    return proxy
