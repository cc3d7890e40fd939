"""Latency repeatability, alone and beside a competing job: the old and the new paired measurement.

The demo model's default configuration is measured ``--repeats`` times, each time with a fresh
int8 session, by :func:`optuna_quant.measure.latency.measure_latency` under two settings, alternating so
that a change of load hits both alike:

- ``old``: each block summarised by its median run, nothing timed again
  (``BenchmarkSettings(statistic="median", retimes=0)``, the measurement before contention handling);
- ``new``: the default :class:`~optuna_quant.measure.latency.BenchmarkSettings` (each block's fastest
  run; contended blocks timed again).

It does so under each ``--load``: ``none`` (whatever else runs on the machine), ``worker`` (a
second process running real trials of the demo objective, random configurations, as a second
worker on the same machine does) and ``burn`` (two processes evaluating the demo model on batches
of 500 images with onnxruntime's default threads, which keep both cores busy). The figure of merit
is the coefficient of variation (CV) of ``lat_diff`` over the repeats; the machine's load average
is printed beside it.

Run::

    python -m benchmarks.bench_latency [--repeats 10] [--load none worker burn] [--json out.json]
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
import dataclasses
import json
import os
from pathlib import Path
import random
import statistics
import subprocess
import sys
import time


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent

import onnxruntime as ort  # noqa: E402

from benchmarks._demo_setup import demo_objective  # noqa: E402
from examples import demo_data  # noqa: E402
from optuna_quant.measure.latency import BenchmarkSettings  # noqa: E402
from optuna_quant.measure.latency import LatencyResult  # noqa: E402
from optuna_quant.measure.latency import measure_latency  # noqa: E402


METHODS = {"old": BenchmarkSettings(statistic="median", retimes=0), "new": BenchmarkSettings()}
LOADS = ("none", "worker", "burn")
BURN_BATCH = 500


def compete(kind: str) -> None:
    """Run one competing job until killed: ``worker`` (real trials) or ``burn`` (batched inference)."""
    objective = demo_objective()
    if kind == "worker":
        rng = random.Random(os.getpid())
        while True:
            params = {name: rng.choice(d.choices) for name, d in objective.space.distributions().items()}
            objective.measure(params)
    inputs = demo_data.evaluation()[0][:BURN_BATCH]
    session = ort.InferenceSession(objective.measurer.model.SerializeToString(), providers=["CPUExecutionProvider"])
    while True:
        session.run(None, {"input": inputs})


@contextmanager
def load(kind: str) -> Iterator[None]:
    """Competing processes of ``kind`` (none, one worker, or two burners) while the block runs."""
    count = {"none": 0, "worker": 1, "burn": 2}[kind]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    procs = [
        subprocess.Popen([sys.executable, "-m", "benchmarks.bench_latency", "--compete", kind], cwd=ROOT, env=env)
        for _ in range(count)
    ]
    try:
        time.sleep(5.0 if count else 0.0)  # let them load the model and start working
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def cv(values: list[float]) -> float:
    """Coefficient of variation: the sample standard deviation over the mean."""
    return statistics.stdev(values) / statistics.mean(values)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--load", nargs="+", choices=LOADS, default=list(LOADS))
    parser.add_argument("--json", type=Path, help="write the measurements to this file")
    parser.add_argument("--compete", choices=("worker", "burn"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.compete:
        compete(args.compete)
        return

    objective = demo_objective()
    int8_model = objective.build(objective.space.default_params()).SerializeToString()
    options = BenchmarkSettings().session_options()  # both methods pin the same threads
    fp32 = ort.InferenceSession(objective.measurer.model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rows = []
    for kind in args.load:
        results: dict[str, list[LatencyResult]] = {name: [] for name in METHODS}
        with load(kind):
            load_before = os.getloadavg()[0]
            for _ in range(args.repeats):
                for name, settings in METHODS.items():
                    int8 = ort.InferenceSession(int8_model, options, providers=["CPUExecutionProvider"])
                    results[name].append(measure_latency(fp32, int8, objective.measurer.latency_feed, settings))
            load_after = os.getloadavg()[0]
        for name, measured in results.items():
            lat = [r.lat_diff for r in measured]
            rows.append(
                {
                    "load": kind,
                    "method": name,
                    "repeats": len(lat),
                    "lat_diff_median": statistics.median(lat),
                    "lat_diff_min": min(lat),
                    "lat_diff_max": max(lat),
                    "lat_diff_cv": cv(lat),
                    "spread_median": statistics.median(r.spread for r in measured),
                    "retimed_mean": statistics.mean(r.retimed for r in measured),
                    "contended": sum(r.contended for r in measured),
                    "loadavg_1min": [load_before, load_after],
                    "results": [dataclasses.asdict(r) for r in measured],
                }
            )
    print("| load | method | lat_diff median (min-max) | CV | spread median | re-timed blocks, mean | contended | load avg |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['load']} | {r['method']} | {r['lat_diff_median']:.3f} ({r['lat_diff_min']:.3f}-{r['lat_diff_max']:.3f}) "
            f"| {100 * r['lat_diff_cv']:.2f} % | {r['spread_median']:.3f} | {r['retimed_mean']:.1f} "
            f"| {r['contended']}/{r['repeats']} | {r['loadavg_1min'][0]:.1f}-{r['loadavg_1min'][1]:.1f} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
