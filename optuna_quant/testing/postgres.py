"""A throwaway PostgreSQL server, started from Debian's binaries in a temp folder.

The server listens on a free local port and runs as the ``postgres`` user when the caller is root
(``initdb`` refuses root). It serves the tests' ``postgres_url`` fixture, which skips with
:data:`NO_BINARIES` as its reason only when no PostgreSQL binaries are installed (any other
failure to start the server is an error), and ``benchmarks/bench_workers.py``.

Example:
    >>> with postgres_server() as url:   # doctest: +SKIP
    ...     study = optuna.create_study(storage=url)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
import glob
import os
from pathlib import Path
import pwd
import shutil
import socket
import subprocess
import tempfile


DATABASE = "optuna_quant"
USER = "quant"
NO_BINARIES = "PostgreSQL binaries (initdb, pg_ctl) are not installed: apt-get install postgresql"


def postgresql_psycopg2(url: str) -> str:
    """The same database for the psycopg2 driver, which SQLAlchemy 2.1 opens only when named.

    Example:
        >>> postgresql_psycopg2("postgresql://quant@127.0.0.1:5432/optuna_quant")
        'postgresql+psycopg2://quant@127.0.0.1:5432/optuna_quant'
    """
    scheme, sep, rest = url.partition("://")
    return f"{scheme.split('+')[0]}+psycopg2{sep}{rest}"


def pg_bindir() -> Path | None:
    """The newest ``/usr/lib/postgresql/<version>/bin``, or the folder of ``initdb`` on the PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def free_port() -> int:
    """A localhost port that nothing listens on (the OS picks a free one and lets it go)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_as(user: str) -> tuple[list[str], pwd.struct_passwd | None]:
    """How to run a server that refuses root: the command prefix and the account, as ``user``
    when the caller is root; as the caller otherwise.

    Raises:
        RuntimeError: If the caller is root and there is no such user.
    """
    if os.geteuid() != 0:
        return [], None
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        raise RuntimeError(f"running as root and there is no {user!r} user to run the server as") from None
    return ["runuser", "-u", user, "--"], account


@contextmanager
def postgres_server(max_connections: int = 200, port: int | None = None, preload: tuple[str, ...] = ()) -> Iterator[str]:
    """Start a server in a temp folder; yield the URL of a fresh database; stop and remove it.

    Args:
        max_connections: Connections the server accepts at once (each worker holds up to three).
        port: The port to listen on; a free one by default.
        preload: Server libraries to load at start (``shared_preload_libraries``), such as
            ``"pg_stat_statements"``, which counts the statements the benchmark's workers run.

    Raises:
        RuntimeError: If no PostgreSQL binaries are installed, or root has no 'postgres' user.
    """
    bindir = pg_bindir()
    if bindir is None:
        raise RuntimeError(NO_BINARIES)
    prefix, account = run_as("postgres")
    folder = Path(tempfile.mkdtemp(prefix="optuna-quant-pg-"))
    if account is not None:
        os.chown(folder, account.pw_uid, account.pw_gid)
    data, port = folder / "data", port or free_port()

    def run(*args: str) -> None:
        subprocess.run([*prefix, *args], check=True, capture_output=True, timeout=120)

    try:
        run(str(bindir / "initdb"), "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync")
        options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections={max_connections}"
        if preload:
            options += f" -c shared_preload_libraries={','.join(preload)}"
        run(str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(folder / "log"), "-w", "start")
        try:
            run(str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", USER, DATABASE)
            # The form the docs show: SQLAlchemy 2.1 opens it with psycopg 3.
            yield f"postgresql://{USER}@127.0.0.1:{port}/{DATABASE}"
        finally:
            run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
    finally:
        shutil.rmtree(folder, ignore_errors=True)

