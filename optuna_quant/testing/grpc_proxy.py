"""Optuna's gRPC storage proxy in front of a database, run by Optuna's own ``run_grpc_proxy_server``
in a process of its own, as a user starts it.

Example:
    >>> with grpc_proxy("postgresql://quant@127.0.0.1:5432/optuna_quant") as url:   # doctest: +SKIP
    ...     study = optuna_quant.create_study(..., storage=url)                      # grpc://127.0.0.1:PORT
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
import subprocess
import sys
import tempfile

from optuna_quant.storages.rdb import optuna_warnings_off
from optuna_quant.testing.postgres import free_port


START_SECONDS = 60.0


def proxy_command(storage_url: str, host: str, port: int) -> list[str]:
    """The command that serves ``storage_url`` on ``host:port``: Optuna's proxy, with Optuna's cache."""
    code = (
        "import optuna; optuna.storages.run_grpc_proxy_server("
        f"optuna.storages.get_storage({storage_url!r}), host={host!r}, port={port})"
    )
    return [sys.executable, "-c", code]


@contextmanager
def grpc_proxy(storage_url: str) -> Iterator[str]:
    """Start the proxy of ``storage_url`` on a free local port; yield its ``grpc://`` URL; stop it.

    Raises:
        RuntimeError: If it does not answer within :data:`START_SECONDS`.
    """
    from optuna.storages import GrpcStorageProxy  # here: grpcio is needed by the caller only

    port = free_port()
    # Its log in a file: a pipe that nobody reads would stop the server once full.
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(proxy_command(storage_url, "127.0.0.1", port), stdout=log, stderr=log)
        try:
            try:
                with optuna_warnings_off():
                    GrpcStorageProxy(host="127.0.0.1", port=port).wait_server_ready(timeout=START_SECONDS)
            except ConnectionError:
                log.seek(0)
                raise RuntimeError(f"the gRPC proxy did not answer: {log.read().decode()[-2000:]}") from None
            yield f"grpc://127.0.0.1:{port}"
        finally:
            server.kill()
            server.wait(timeout=60)
