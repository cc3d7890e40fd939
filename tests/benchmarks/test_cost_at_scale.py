"""The cost model at scale reads the committed worker reports as docs/workers.md shows it."""

from __future__ import annotations

import json
from pathlib import Path
import subprocess

from conftest import ROOT
from conftest import subprocess_env
import pytest

from benchmarks.cost_at_scale import parse_args
from benchmarks.cost_at_scale import table


RESULTS = ROOT / "benchmarks" / "results"
REPORTS = [RESULTS / "workers_postgresql.json", RESULTS / "workers_grpc.json"]


def test_the_committed_reports_scale_to_each_worker_count() -> None:
    lines = table(REPORTS, 8, (100, 1000), 20.0).splitlines()[2:]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    assert {(row[0], row[1], row[2]) for row in rows} == {
        (storage, protocol, workers)
        for storage in ("postgresql", "grpc")
        for protocol in ("optuna-quant", "plain optuna")
        for workers in ("100", "1,000")
    }
    for storage in ("postgresql", "grpc"):
        for protocol in ("optuna-quant", "plain optuna"):
            small, large = (row for row in rows if row[:2] == [storage, protocol])
            # Ten times the workers at the same trial time: ten times the trials and the database's load.
            assert float(large[3].replace(",", "")) == 10 * float(small[3].replace(",", ""))
            if storage == "postgresql":
                assert int(large[6].replace(",", "")) >= 10 * int(small[6].replace(",", "")) - 9 > 0


def test_workers_md_shows_what_its_command_prints() -> None:
    shown = (ROOT / "docs" / "workers.md").read_text()
    prefix = ".venv/bin/python -m benchmarks.cost_at_scale "
    (command,) = [line for line in shown.splitlines() if line.startswith(prefix)]
    printed = subprocess.run(
        command, shell=True, cwd=ROOT, env=subprocess_env(), check=True, capture_output=True, text=True
    ).stdout.strip()
    assert f"{command}\n```\n\n{printed}\n\n" in shown


def test_a_report_without_server_counts_or_the_worker_count_is_refused(tmp_path: Path) -> None:
    sqlite = tmp_path / "workers_sqlite.json"
    run = json.loads(REPORTS[0].read_text())[0]
    sqlite.write_text(json.dumps([{**run, "storage": "sqlite", "peak_connections": None}]))
    with pytest.raises(ValueError, match="workers_sqlite.json: a run has no server counts"):
        table([sqlite], run["workers"], (100,), 20.0)
    with pytest.raises(ValueError, match=r"holds no run of 3 workers"):
        table(REPORTS[:1], 3, (100,), 20.0)
    with pytest.raises(SystemExit):
        parse_args([str(tmp_path / "missing.json")])
