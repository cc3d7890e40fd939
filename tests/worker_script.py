"""One worker of a shared study, run as its own OS process by the multi-worker tests.

It tunes the tiny CNN of ``conftest.build_cnn`` with ``trials_load_method="warm_start"``, as
``optuna-quant worker`` does on another machine.

Example:
    $ python tests/worker_script.py postgresql://... --study s --n-trials 12 --eval-sleep 0.3
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

from conftest import build_cnn  # noqa: E402
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
    rng = np.random.default_rng(1)
    calib = [rng.random((1, 3, 12, 12), dtype=np.float32) for _ in range(16)]
    inputs = np.random.default_rng(2).random((200, 3, 12, 12), dtype=np.float32)
    fp32 = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    agreement = oq.Top1Accuracy(inputs, fp32.run(None, {"input": inputs})[0].argmax(axis=1))

    def evaluate(session: ort.InferenceSession) -> float:
        time.sleep(args.eval_sleep)  # a trial long enough to be caught running
        return agreement(session)

    study = oq.create_study(
        model,
        calib,
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
        benchmark=oq.BenchmarkSettings(warmup=2, blocks=3, min_seconds=0.03),
        heartbeat_interval=1,
        grace_period=2,
    )
    study.optimize(n_trials=args.n_trials)
    return 0


if __name__ == "__main__":
    sys.exit(main())
