"""Worker scaling: trials per minute with 1 and 2 workers on one PostgreSQL study, side by side.

Each worker is its own process running ``create_study(..., trials_load_method="warm_start")`` and
``optimize`` on a shared study, with onnxruntime pinned to one thread. The model is the
random-weight CNN of :mod:`examples.tiny_cnn` (3x32x32 input, 32/64/64 channels) whose trial costs
about a second here: quantization from cached ranges, a top-1 evaluation of 384 images (agreement
with fp32) and the paired latency timing. Rates are taken from the study's own timestamps, from
the reference trial's end (when every worker can start) to the last trial's end, so process
start-up is left out. The runs alternate (1, 2, 2, 1 workers) so
that a change of load on the machine hits both sides. The CPU seconds the worker processes spent
per trial (start-up included) show what sharing the study costs, whatever else runs on the machine.

Run::

    .venv/bin/python -m benchmarks.bench_workers [--trials 30] [--storage postgresql://...]

Without ``--storage`` a throwaway PostgreSQL server is started from Debian's binaries
(:func:`optuna_quant.testing.postgres.postgres_server`, as for the tests).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from contextlib import ExitStack
import logging
import os
from pathlib import Path
import resource
import statistics
import subprocess
import sys


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent

import optuna  # noqa: E402

from examples.tiny_cnn import build_cnn  # noqa: E402
from examples.tiny_cnn import calibration_data  # noqa: E402
from examples.tiny_cnn import fp32_agreement  # noqa: E402
import optuna_quant as oq  # noqa: E402
from optuna_quant.testing.postgres import postgres_server  # noqa: E402


CHANNELS = (32, 64, 64)
SCOPES = ("layer", "granularity", "mode")  # Entropy calibration alone takes seconds: left out
ORDER = (1, 2, 2, 1)


def work(storage: str, study_name: str, n_trials: int, seed: int) -> None:
    """One worker: tune the model on the shared study until it holds ``n_trials`` trials."""
    model = build_cnn(channels=CHANNELS, image_size=32)
    benchmark = oq.BenchmarkSettings(threads=1, warmup=3, blocks=5, min_seconds=0.5)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = oq.create_study(
        model,
        calibration_data(model),
        fp32_agreement(model, n=384, session_options=benchmark.session_options()),
        accuracy_loss=1.0,
        latency_reduce=100.0,  # out of reach: every worker runs its whole share
        sampler="tpe",
        seed=seed,
        scopes=SCOPES,
        storage=storage,
        study_name=study_name,
        trials_load_method="warm_start",
        benchmark=benchmark,
    )
    logging.getLogger("optuna_quant").setLevel(logging.WARNING)
    study.optimize(n_trials=n_trials)


def trials_per_minute(storage: str, study_name: str) -> tuple[float, float]:
    """Trials per minute after the reference, and the median seconds of one trial."""
    trials = optuna.load_study(study_name=study_name, storage=storage).get_trials()
    reference = next(t for t in trials if t.user_attrs.get("reference"))
    others = [t for t in trials if t is not reference]
    start = reference.datetime_complete
    end = max(t.datetime_complete for t in others)
    per_trial = statistics.median((t.datetime_complete - t.datetime_start).total_seconds() for t in others)
    return 60 * len(others) / (end - start).total_seconds(), per_trial


def run(storage: str, workers: int, n_trials: int, label: str) -> tuple[float, float, float]:
    """Run ``workers`` worker processes on a fresh study.

    Returns:
        Trials per minute, the median seconds of one trial, and the workers' CPU seconds per trial.
    """
    name = f"bench-workers-{label}"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_workers", "--worker", storage, name, str(n_trials), str(seed)],
            cwd=ROOT,
        )
        for seed in range(workers)
    ]
    for process in processes:
        if process.wait() != 0:
            raise RuntimeError(f"worker of {name} exited with {process.returncode}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return (*trials_per_minute(storage, name), cpu / n_trials)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=30, help="trials per study (default 30)")
    parser.add_argument("--storage", help="a PostgreSQL URL; default: a throwaway local server")
    parser.add_argument("--worker", nargs=4, metavar=("URL", "STUDY", "N", "SEED"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        url, study_name, n, seed = args.worker
        work(url, study_name, int(n), int(seed))
        return
    with ExitStack() as stack:
        storage = args.storage
        if storage is None:
            storage = stack.enter_context(postgres_server())
        print(f"load average before: {os.getloadavg()}")
        rates: dict[int, list[float]] = {1: [], 2: []}
        for i, workers in enumerate(ORDER):
            rate, seconds, cpu = run(storage, workers, args.trials, f"{workers}-{i}")
            rates[workers].append(rate)
            print(
                f"{workers} worker(s): {rate:6.1f} trials/min (median trial {seconds:.2f} s, "
                f"{cpu:.2f} CPU s per trial)"
            )
        print(f"load average after: {os.getloadavg()}")
        one, two = statistics.mean(rates[1]), statistics.mean(rates[2])
        print(f"mean: 1 worker {one:.1f} trials/min, 2 workers {two:.1f} trials/min, ratio {two / one:.2f}x")


if __name__ == "__main__":
    main()
