"""The worker benchmark runs as docs/benchmarks.md shows it, on a real PostgreSQL server: its
server-side statement count tells what a trial costs the database beside plain Optuna's, and its
profile where a worker's CPU goes."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT
from conftest import subprocess_env
import pytest

from benchmarks import bench_workers
from optuna_quant.testing.postgres import NO_BINARIES
from optuna_quant.testing.postgres import pg_bindir


@pytest.mark.skipif(pg_bindir() is None, reason=NO_BINARIES)
def test_one_worker_of_each_protocol_runs_and_its_statements_are_counted(tmp_path) -> None:
    out = tmp_path / "workers.json"
    # Its own process, as the docs run it: the benchmark forks its workers, which a process
    # with pytest's threads cannot safely do.
    command = ["-m", "benchmarks.bench_workers", "--storage", "postgresql", "--workers", "1", "--rounds", "5", "--profile"]
    subprocess.run(
        [sys.executable, *command, "--seconds", "0.5", "--json", str(out)],
        cwd=ROOT, env=subprocess_env(), check=True, capture_output=True, timeout=300,
    )
    ours, plain = json.loads(out.read_text())
    assert (ours["protocol"], plain["protocol"]) == ("optuna-quant", "plain optuna")
    assert ours["trials"] == 5 and plain["trials"] == 5
    # Plain Optuna: a transaction per parameter (13), per ask and per tell, each of a few statements.
    assert 13 < plain["transactions_per_trial"] < plain["statements_per_trial"]
    # A measurement's 19 records are one transaction: with them one each, ours was 59 to plain's 18.
    assert ours["transactions_per_trial"] < 2.5 * plain["transactions_per_trial"]
    # Profiled, ours tells the CPU of each part of a trial, every one of which a run goes through.
    parts = ours["cpu_by_role_per_trial"]
    assert set(parts) == set(bench_workers.ROLES) and all(cpu > 0 for cpu in parts.values()), parts
    assert plain["cpu_by_role_per_trial"] is None
    # Each worker holds a connection of its own at least, counted by the server while it ran.
    assert ours["peak_connections"] >= 1 and plain["peak_connections"] >= 1
