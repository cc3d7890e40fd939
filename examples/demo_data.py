"""The demo's data as entry points for ``examples/demo_config.yaml``.

``optuna-quant tune`` calls each function without arguments: 200 training digits calibrate, the
1,500 test digits score top-1 accuracy.

Example:
    >>> len(calibration())   # doctest: +SKIP
    200
"""

from __future__ import annotations

import numpy as np

from examples.mnist import load_mnist


CALIBRATION_SAMPLES = 200


def calibration() -> list[np.ndarray]:
    """The first 200 training digits, one batch of one each."""
    x_train = load_mnist().x_train
    return [x_train[i : i + 1] for i in range(CALIBRATION_SAMPLES)]


def evaluation() -> tuple[np.ndarray, np.ndarray]:
    """The test digits and their labels: ``(inputs, labels)``."""
    split = load_mnist()
    return split.x_test, split.y_test

