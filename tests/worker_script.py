"""One worker of a shared study, run as its own OS process by the multi-worker tests.

It tunes the tests' tiny CNN on its fixtures' data (:mod:`examples.tiny_cnn`) with
``trials_load_method="warm_start"``, as ``optuna-quant worker`` does on another machine.

For fault injection, ``--die-at STAGE`` makes the process SIGKILL itself, as a crash or an
out-of-memory kill would, in the middle of a stage of a trial: ``calibration`` (onnxruntime's
range collection), ``reference`` (evaluating the reference), ``eval:N`` and ``latency:N`` (the
N-th evaluation or latency measurement of this process), ``ask:N`` (the N-th trial Optuna asks
for, once it exists in the storage and before its objective runs). ``--stall-at STAGE --stalled
FILE`` instead creates ``FILE`` there and sleeps, so that a Ctrl-C surely finds a trial running.

Example:
    $ python tests/worker_script.py postgresql://... --study s --n-trials 12 --eval-sleep 0.3
    $ python tests/worker_script.py sqlite:///s.db --study s --n-trials 12 --die-at calibration
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
import faulthandler
import os
from pathlib import Path
import signal
import sys
import time


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# Run as a script, this file has tests/ on sys.path, not the checkout that holds examples/.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from conftest import FAST_BENCH  # noqa: E402  (tests/ is this script's sys.path[0])
import onnxruntime as ort  # noqa: E402
from onnxruntime.quantization import calibrate  # noqa: E402

from examples.tiny_cnn import build_cnn  # noqa: E402
from examples.tiny_cnn import calibration_data  # noqa: E402
from examples.tiny_cnn import fp32_agreement  # noqa: E402
import optuna_quant as oq  # noqa: E402
import optuna_quant.measure.latency  # noqa: E402
import optuna_quant.measure.measurer  # noqa: E402
import optuna_quant.trial.objective  # noqa: E402


def die() -> None:
    """End this process as the kernel kills it: no handler, no clean-up."""
    os.kill(os.getpid(), signal.SIGKILL)


def stall(flag: str) -> Callable[[], None]:
    """What stalls this process: it creates the file ``flag``, then sleeps until a signal ends it."""

    def stalled() -> None:
        Path(flag).touch()
        time.sleep(3600)

    return stalled


def inject(stage: str, action: Callable[[], None] = die) -> None:
    """Run ``action`` (by default, SIGKILL this process) in the middle of ``stage`` (see the module docstring)."""
    name, _, count = stage.partition(":")
    remaining = [int(count or 1)]
    in_reference = [False]

    def countdown() -> None:
        remaining[0] -= 1
        if remaining[0] == 0:
            action()

    def wrap(owner: object, attr: str, before: object) -> None:
        original = getattr(owner, attr)

        def wrapped(*args: object, **kwargs: object) -> object:
            before()  # type: ignore[operator]
            return original(*args, **kwargs)

        setattr(owner, attr, wrapped)

    if name == "calibration":
        for calibrater in (calibrate.MinMaxCalibrater, calibrate.HistogramCalibrater):
            wrap(calibrater, "collect_data", action)
    elif name == "reference":
        original = optuna_quant.trial.objective.measure_reference

        def measure_reference(*args: object, **kwargs: object) -> object:
            in_reference[0] = True
            return original(*args, **kwargs)

        optuna_quant.trial.objective.measure_reference = measure_reference  # the name the objective calls
        wrap(optuna_quant.measure.measurer.Measurer, "_evaluate", lambda: in_reference[0] and action())
    elif name == "eval":
        wrap(optuna_quant.measure.measurer.Measurer, "_evaluate", countdown)
    elif name == "latency":
        wrap(optuna_quant.measure.latency, "measure_latency", countdown)  # steady_latency calls it
    elif name == "ask":
        wrap(oq.TPESampler, "before_trial", countdown)  # Optuna calls it once the trial is created
    else:
        raise SystemExit(f"unknown stage {stage!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("storage")
    parser.add_argument("--study", required=True)
    parser.add_argument("--n-trials", type=int, required=True)
    parser.add_argument("--eval-sleep", type=float, default=0.0, help="seconds added to each evaluation")
    parser.add_argument("--accuracy-loss", type=float, default=5.0)
    parser.add_argument("--latency-reduce", type=float, default=1.0)
    parser.add_argument("--stop-on-target", action="store_true")
    parser.add_argument("--seed", type=int, default=None)
    # Entropy calibration takes seconds even on this model: leave the range estimator fixed.
    parser.add_argument("--scopes", default="layer,granularity,mode")
    parser.add_argument("--die-at", default=None, help="SIGKILL this process in that stage of a trial")
    parser.add_argument("--stall-at", default=None, help="create --stalled's file and sleep in that stage")
    parser.add_argument("--stalled", default=None, help="the file --stall-at creates")
    # Off unless asked: the kill points count stages, and the sensitivity measurement after the
    # reference times and evaluates models too.
    parser.add_argument("--sensitivity", action="store_true", help="measure the study's whole sensitivity (guidance)")
    parser.add_argument("--heartbeat", default="1,2", help="heartbeat interval and grace period, seconds")
    args = parser.parse_args(argv)
    if args.stall_at and not args.stalled:
        parser.error("--stall-at needs --stalled")
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Ctrl-C as in a terminal: a runner started in the background of a non-interactive shell
    # ignores SIGINT, its children inherit that, and Python then never raises KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.die_at:
        inject(args.die_at)
    if args.stall_at:
        inject(args.stall_at, stall(args.stalled))
    interval, grace = (int(v) for v in args.heartbeat.split(","))

    model = build_cnn()
    agreement = fp32_agreement(model)

    def evaluate(session: ort.InferenceSession) -> float:
        time.sleep(args.eval_sleep)  # a trial long enough to be caught running
        return agreement(session)

    study = oq.create_study(
        model,
        calibration_data(model),
        evaluate,
        accuracy_loss=args.accuracy_loss,
        latency_reduce=args.latency_reduce,
        sampler="tpe",
        seed=args.seed,
        scopes=args.scopes.split(","),
        storage=args.storage,
        study_name=args.study,
        trials_load_method="warm_start",
        stop_on_target=args.stop_on_target,
        benchmark=FAST_BENCH,
        heartbeat_interval=interval,
        grace_period=grace,
        sensitivity="full" if args.sensitivity else False,
    )
    study.optimize(n_trials=args.n_trials)
    return 0


if __name__ == "__main__":
    sys.exit(main())
