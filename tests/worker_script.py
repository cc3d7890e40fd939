"""One worker of a shared study, run as its own OS process by the multi-worker tests.

It tunes the tests' tiny CNN on its fixtures' data (:mod:`examples.tiny_cnn`) with
``trials_load_method="warm_start"``, as ``optuna-quant worker`` does on another machine.

Example:
    $ python tests/worker_script.py postgresql://... --study s --n-trials 12 --eval-sleep 0.3
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# Run as a script, this file has tests/ on sys.path, not the checkout that holds examples/.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import onnxruntime as ort  # noqa: E402

from conftest import FAST_BENCH  # noqa: E402  (tests/ is this script's sys.path[0])
from examples.tiny_cnn import build_cnn  # noqa: E402
from examples.tiny_cnn import calibration_data  # noqa: E402
from examples.tiny_cnn import fp32_agreement  # noqa: E402
import optuna_quant as oq  # noqa: E402


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
    args = parser.parse_args(argv)

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
        heartbeat_interval=1,
        grace_period=2,
    )
    study.optimize(n_trials=args.n_trials)
    return 0


if __name__ == "__main__":
    sys.exit(main())
