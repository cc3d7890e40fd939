"""A throwaway MariaDB (or MySQL) server, started from Debian's binaries in a temp folder.

The server listens on a free local port, takes any user without a password
(``--skip-grant-tables``) and runs as the ``mysql`` user when the caller is root. It serves the
tests' ``mariadb_url`` fixture, which skips with :data:`NO_BINARIES` as its reason only when no
server binaries are installed (any other failure to start the server is an error).

Example:
    >>> with mariadb_server() as url:   # doctest: +SKIP
    ...     study = optuna.create_study(storage=url)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
import os
from pathlib import Path
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from optuna_quant.testing.postgres import free_port
from optuna_quant.testing.postgres import run_as


DATABASE = "optuna_quant"
USER = "quant"
NO_BINARIES = "MariaDB binaries (mariadbd, mariadb-install-db) are not installed: apt-get install mariadb-server"
START_SECONDS = 120


def server_binaries() -> tuple[Path, Path] | None:
    """The server and its data-folder installer, from the PATH or Debian's ``/usr/sbin``."""
    found = []
    for names in (("mariadbd", "mysqld"), ("mariadb-install-db", "mysql_install_db")):
        paths = [shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin") for name in names]
        found.append(next((Path(p) for p in paths if p), None))
    server, installer = found
    return None if server is None or installer is None else (server, installer)


def _wait_until_listening(port: int, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the MariaDB server exited with {server.returncode}: {log.read_text()[-2000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the MariaDB server did not listen within {START_SECONDS} s: {log.read_text()[-2000:]}")


@contextmanager
def mariadb_server(port: int | None = None) -> Iterator[str]:
    """Start a server in a temp folder; yield the URL of a fresh database; stop and remove it.

    Args:
        port: The port to listen on; a free one by default.

    Raises:
        RuntimeError: If no server binaries are installed, or root has no 'mysql' user.
    """
    binaries = server_binaries()
    if binaries is None:
        raise RuntimeError(NO_BINARIES)
    server_binary, installer = binaries
    prefix, account = run_as("mysql")
    folder = Path(tempfile.mkdtemp(prefix="optuna-quant-mariadb-"))
    if account is not None:
        os.chown(folder, account.pw_uid, account.pw_gid)
    data, port, log = folder / "data", port or free_port(), folder / "server.log"
    try:
        subprocess.run(
            [*prefix, str(installer), "--no-defaults", f"--datadir={data}", "--skip-test-db", "--auth-root-authentication-method=normal"],
            check=True,
            capture_output=True,
            timeout=START_SECONDS,
        )
        server = subprocess.Popen(
            [
                *prefix, str(server_binary), "--no-defaults", f"--datadir={data}", f"--port={port}",
                "--bind-address=127.0.0.1", f"--socket={folder / 'sock'}", f"--pid-file={folder / 'pid'}",
                f"--log-error={log}", "--skip-grant-tables", "--innodb-flush-log-at-trx-commit=0",
                "--max-connections=500",
            ],
            start_new_session=True,  # runuser's child too is stopped with the session
        )
        try:
            _wait_until_listening(port, server, log)
            import sqlalchemy  # here: only a caller that starts a server needs it

            engine = sqlalchemy.create_engine(f"mysql+pymysql://{USER}@127.0.0.1:{port}/mysql")
            with engine.begin() as connection:
                connection.execute(sqlalchemy.text(f"CREATE DATABASE {DATABASE}"))
            engine.dispose()
            yield f"mysql+pymysql://{USER}@127.0.0.1:{port}/{DATABASE}"
        finally:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=60)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
