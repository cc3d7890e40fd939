"""The demo model and data, shared by the trial-cost and latency benchmarks."""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from examples.demo_model import build_demo_model  # noqa: E402
from examples.mnist import load_mnist  # noqa: E402
from optuna_quant import QuantizationObjective  # noqa: E402
from optuna_quant import Targets  # noqa: E402
from optuna_quant import Top1Accuracy  # noqa: E402
from optuna_quant.latency import BenchmarkSettings  # noqa: E402


def demo_objective(benchmark: BenchmarkSettings | None = None) -> QuantizationObjective:
    """The demo's objective: the rescaled MNIST CNN, 200 calibration images, 1,500 test images."""
    data = load_mnist()
    return QuantizationObjective(
        str(build_demo_model()),
        [data.x_train[i : i + 1] for i in range(200)],
        Top1Accuracy(data.x_test, data.y_test),
        targets=Targets(accuracy_loss=1.0, latency_reduce=1.5),
        benchmark=benchmark,
    )
