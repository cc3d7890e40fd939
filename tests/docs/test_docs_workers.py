"""The commands docs/workers.md shows to start workers on each storage, run as written.

Each storage's server listens where the example configs of ``examples/workers/`` say
(PostgreSQL on 127.0.0.1:5432, MariaDB on 127.0.0.1:3306, throwaway servers of the tests; a test
whose port is taken is skipped), the gRPC proxy is started by the documented command itself, and
two workers run the documented command together, through the shell, in a working copy of the
repository (:func:`test_docs_commands._working_copy`). The study then holds the configs'
6 trials, every one finished.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextlib import ExitStack
import os
from pathlib import Path
import signal
import socket
import subprocess

import optuna
from optuna.trial import TrialState
import pytest
from test_docs_commands import _env
from test_docs_commands import _the
from test_docs_commands import _working_copy
from test_docs_commands import GRPC_PROXY
from test_docs_commands import WORKER_COMMANDS
from test_docs_commands import WORKERS_MD
import yaml

from optuna_quant.storages.factory import open_storage
from optuna_quant.study.worker import counted_trials
from optuna_quant.testing import mariadb
from optuna_quant.testing.postgres import pg_bindir
from optuna_quant.testing.postgres import postgres_server


TIMEOUT = 1800  # two workers of the demo's model on a loaded 2-core machine


def _free(port: int) -> None:
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            pytest.skip(f"port {port}, where the documented config finds its server, is taken")


@contextmanager
def _proxy(command: str, cwd: Path) -> Iterator[None]:
    server = subprocess.Popen(
        command, shell=True, cwd=cwd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        open_storage("grpc://127.0.0.1:13000")  # waits for it to answer
        yield
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the shell and the proxy it started
        server.wait(timeout=60)


@contextmanager
def _servers(kind: str, cwd: Path) -> Iterator[None]:
    with ExitStack() as stack:
        if kind in ("postgresql", "grpc"):
            if pg_bindir() is None:
                pytest.skip("PostgreSQL binaries are not installed")
            _free(5432)
            stack.enter_context(postgres_server(port=5432))
        if kind == "mariadb":
            if mariadb.server_binaries() is None:
                pytest.skip(mariadb.NO_BINARIES)
            _free(3306)
            stack.enter_context(mariadb.mariadb_server(port=3306))
        if kind == "grpc":
            _free(13000)
            stack.enter_context(_proxy(_the(WORKERS_MD, GRPC_PROXY).text, cwd))
        yield


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(WORKER_COMMANDS))
def test_workers_start_on_each_storage_as_workers_md_shows(kind: str, tmp_path: Path) -> None:
    command = _the(WORKERS_MD, WORKER_COMMANDS[kind]).text
    folder = _working_copy(tmp_path / "checkout")
    config = yaml.safe_load((folder / command.split()[-1]).read_text())
    with _servers(kind, folder):
        workers = [
            subprocess.Popen(command, shell=True, cwd=folder, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for _ in range(2)
        ]
        for worker in workers:
            output, _ = worker.communicate(timeout=TIMEOUT)
            assert worker.returncode == 0, output[-3000:]
        storage = config["storage"]
        if storage.startswith("journal:"):  # relative to the config's folder
            storage = f"journal:{(folder / 'examples' / 'workers' / storage.removeprefix('journal:')).resolve()}"
        trials = optuna.load_study(study_name=config["study_name"], storage=open_storage(storage)).get_trials()
    assert counted_trials(trials) == config["max_trials"]
    # Pruned: slower than the best model within target (pruning, the default); failed: a dead worker's.
    assert {t.state for t in trials} <= {TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL}
