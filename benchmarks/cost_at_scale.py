"""What a study costs its database at 100 to 10,000 workers, from what ``bench_workers`` measured.

A worker spends most of a trial building and timing a model; the database only sees the
coordination and the records. So the load on the database grows with the trials per second,
``workers / trial seconds``, times what one trial costs it, which ``bench_workers`` measures per
protocol (optuna-quant's and plain Optuna's, side by side in one run): the server's CPU per
trial (through the gRPC proxy, the proxy's and the database's together), its statements per
trial and its connections per worker. This module reads those figures from one worker count of
each report (8 by default: the most workers that 2 cores run near full efficiency) and scales
them; it assumes that the per-trial cost stays as measured, which lock contention at scale can
only raise.

Run::

    .venv/bin/python -m benchmarks.cost_at_scale benchmarks/results/workers_postgresql.json benchmarks/results/workers_grpc.json

Example:
    >>> run = {"storage": "postgresql", "protocol": "plain optuna", "workers": 8, "server_cpu_per_trial": 0.01,
    ...        "statements_per_trial": 90.0, "peak_connections": 8, "worker_cpu_per_trial": 0.04}
    >>> at_scale(run, workers=1000, trial_seconds=20.0)
    {'trials_per_second': 50.0, 'server_cores': 0.5, 'statements_per_second': 4500.0, 'connections': 1000, 'worker_core_share': 0.002}
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import json
import math
from pathlib import Path
from typing import Any


SCALES = (100, 1000, 10000)
TRIAL_SECONDS = 20.0
"""A trial's time on its worker: building, calibrating and timing a model of the benchmark's size."""


def at_scale(run: dict[str, Any], workers: int, trial_seconds: float) -> dict[str, float]:
    """The database's load when ``workers`` workers run trials of ``trial_seconds`` at the per-trial
    cost that ``run`` (one entry of a ``bench_workers`` report) measured.

    Returns:
        Trials a second, the server's cores, its statements a second, the connections, and the
        share of a worker's core spent coordinating.
    """
    rate = workers / trial_seconds
    per_worker = run["peak_connections"] / run["workers"]
    return {
        "trials_per_second": rate,
        "server_cores": rate * run["server_cpu_per_trial"],
        "statements_per_second": rate * run["statements_per_trial"],
        "connections": math.ceil(workers * per_worker),
        "worker_core_share": run["worker_cpu_per_trial"] / trial_seconds,
    }


def table(reports: Sequence[Path], measured_at: int, scales: Sequence[int], trial_seconds: float) -> str:
    """The markdown table of :func:`at_scale` for each report's runs at ``measured_at`` workers.

    Raises:
        ValueError: If a report has no run of ``measured_at`` workers, or none that counted the
            server's statements and connections (an SQLite report).
    """
    lines = [
        "| storage | protocol | workers | trials/s | server cores | statements/s | connections "
        "| a worker's core spent coordinating |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path in reports:
        runs = [run for run in json.loads(path.read_text()) if run["workers"] == measured_at]
        if not runs:
            raise ValueError(f"{path} holds no run of {measured_at} workers.")
        if any(run.get("peak_connections") is None for run in runs):
            raise ValueError(f"{path}: a run has no server counts (SQLite, or a report from before they were counted).")
        for workers in scales:
            for run in runs:
                cost = at_scale(run, workers, trial_seconds)
                # Through the proxy the workers hold no database connection: the proxy's pool does.
                connections = "the proxy's" if run["storage"] == "grpc" else f"{cost['connections']:,}"
                lines.append(
                    f"| {run['storage']} | {run['protocol']} | {workers:,} | {cost['trials_per_second']:,.0f} | "
                    f"{cost['server_cores']:,.1f} | {cost['statements_per_second']:,.0f} | {connections} | "
                    f"{cost['worker_core_share']:.1%} |"
                )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", type=Path, help="bench_workers --json reports")
    parser.add_argument("--measured-at", type=int, default=8, help="the worker count whose runs are scaled")
    parser.add_argument("--scales", default=",".join(map(str, SCALES)), help="worker counts, comma-separated")
    parser.add_argument("--trial-seconds", type=float, default=TRIAL_SECONDS, help="a trial's time on its worker")
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.reports if not path.is_file()]
    if missing:
        parser.error(f"no such report: {', '.join(missing)}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    scales = [int(n) for n in args.scales.split(",")]
    print(table(args.reports, args.measured_at, scales, args.trial_seconds))


if __name__ == "__main__":
    main()
