"""A paired per-sample test of the accuracy loss: is a model confidently over the target yet?

An evaluation by samples (:class:`~optuna_quant.measure.evaluate.SampleScores`) scores the int8
model on the same samples, in the same order, as the fp32 model. After ``n`` of them, the paired
differences ``d = fp32 - int8`` estimate the accuracy loss: ``mean(d) / fp32_accuracy``, with a
standard error ``std(d) / sqrt(n)``. The lower bound ``(mean(d) - z * std(d) / sqrt(n)) /
fp32_accuracy`` is below the true loss with a probability of about 0.9987 at ``z = 3`` (one-sided,
by the central limit theorem, as Optuna's ``WilcoxonPruner`` tests paired samples); once it is
above the target, the rest of the evaluation cannot bring the model within it.

Example:
    >>> import numpy as np
    >>> fp32 = np.ones(400)
    >>> int8 = np.r_[np.zeros(40), np.ones(160)]   # 40 of the first 200 samples lost
    >>> round(acc_loss_lower_bound(fp32, int8, fp32_accuracy=1.0), 3)
    0.115
"""

from __future__ import annotations

import math

import numpy as np


CONFIDENCE_Z = 3.0
"""Standard errors the mean difference must clear: one-sided, about 1 in 770 for one look."""
MIN_SAMPLES = 100
"""Samples scored before the bound is trusted: fewer make the normal approximation loose."""


def acc_loss_lower_bound(fp32: np.ndarray, int8: np.ndarray, fp32_accuracy: float, z: float = CONFIDENCE_Z) -> float:
    """A lower confidence bound of the relative accuracy loss, from the int8 scores so far.

    Args:
        fp32: The fp32 model's per-sample scores, all of them.
        int8: The int8 model's scores of the first ``len(int8)`` of those samples.
        fp32_accuracy: The fp32 score over all samples, which the loss is relative to.
        z: Standard errors below the mean.

    Returns:
        The bound, or ``-inf`` before :data:`MIN_SAMPLES` samples or where ``fp32_accuracy`` is not
        positive (no relative loss to bound).
    """
    n = len(int8)
    if n < MIN_SAMPLES or fp32_accuracy <= 0:
        return -math.inf
    differences = fp32[:n] - int8
    spread = float(np.std(differences, ddof=1))
    return (float(np.mean(differences)) - z * spread / math.sqrt(n)) / fp32_accuracy
