"""Storage URLs: their passwords masked for messages, the error that names a storage, and what
the URLs beside SQLAlchemy's name (``journal:PATH``, ``grpc://HOST:PORT``).

Example:
    >>> masked_url("postgresql://quant:secret@db.example.com/studies")
    'postgresql://quant:***@db.example.com/studies'
    >>> masked_url("quant:p@ss@db.example.com/studies?password=p@ss")
    'quant:***@db.example.com/studies?password=***'
    >>> journal_file("journal:/shared/studies/resnet.log")
    PosixPath('/shared/studies/resnet.log')
    >>> grpc_address("grpc://proxy.example.com:13000")
    ('proxy.example.com', 13000)
"""

from __future__ import annotations

from pathlib import Path
import re

from optuna.storages import BaseStorage
from optuna.storages import RDBStorage
import sqlalchemy
from sqlalchemy.engine import make_url


_QUERY_PASSWORD = re.compile(r"([?&](?:password|passwd|pwd)=)[^&]*", re.IGNORECASE)
JOURNAL_SCHEME = "journal:"
GRPC_SCHEME = "grpc://"


SHARED_STORAGES = (
    "PostgreSQL or MySQL/MariaDB (a database URL), a journal file on a shared file system "
    "('journal:PATH') or Optuna's gRPC proxy in front of a database ('grpc://HOST:PORT')"
)
"""The storages whose workers on several machines share a study, as messages name them."""


class StorageError(ValueError):
    """A storage that cannot be opened or shared; the message names it, its password masked."""


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


def journal_file(url: str) -> Path | None:
    """The log file of a ``journal:PATH`` URL (a relative path from here); else ``None``."""
    if not url.startswith(JOURNAL_SCHEME):
        return None
    return Path(url.removeprefix(JOURNAL_SCHEME)).expanduser()


def grpc_address(url: str) -> tuple[str, int] | None:
    """The host and port of Optuna's gRPC proxy named by a ``grpc://HOST:PORT`` URL; else ``None``.

    Raises:
        StorageError: If the port is missing or no number.
    """
    if not url.startswith(GRPC_SCHEME):
        return None
    host, _, port = url.removeprefix(GRPC_SCHEME).rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise StorageError(f"Storage URL {masked_url(url)!r} names no gRPC proxy: give grpc://HOST:PORT.")
    return host, int(port)


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
