"""The demo model and data, shared by the trial-cost and latency benchmarks."""

from __future__ import annotations

import os


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from examples import demo_data  # noqa: E402
from examples.demo_model import build_demo_model  # noqa: E402
from optuna_quant import QuantizationObjective  # noqa: E402
from optuna_quant import Targets  # noqa: E402
from optuna_quant import Top1Accuracy  # noqa: E402
from optuna_quant.measure.latency import BenchmarkSettings  # noqa: E402


def demo_objective(benchmark: BenchmarkSettings | None = None) -> QuantizationObjective:
    """The demo's objective: the rescaled MNIST CNN, 200 calibration images, 1,500 test images."""
    return QuantizationObjective(
        str(build_demo_model()),
        demo_data.calibration(),
        Top1Accuracy(*demo_data.evaluation()),
        targets=Targets(accuracy_loss=1.0, latency_reduce=1.5),
        benchmark=benchmark,
    )
