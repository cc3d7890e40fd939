"""The paired per-sample bound of the accuracy loss: when it may stop an evaluation, and how rarely it errs."""

from __future__ import annotations

import math

import numpy as np

from optuna_quant.measure.paired import acc_loss_lower_bound
from optuna_quant.measure.paired import MIN_SAMPLES


def test_too_few_samples_or_no_positive_baseline_bound_nothing() -> None:
    fp32, int8 = np.ones(1000), np.zeros(MIN_SAMPLES - 1)
    assert acc_loss_lower_bound(fp32, int8, 1.0) == -math.inf
    assert acc_loss_lower_bound(fp32, np.zeros(MIN_SAMPLES), -0.5) == -math.inf
    assert acc_loss_lower_bound(fp32, np.zeros(MIN_SAMPLES), 1.0) == 1.0  # every sample lost, no spread


def _stops(lost: int, evaluations: int, seed: int) -> float:
    """The share of evaluations stopped at some look: 2,000 samples, fp32 right on about 90 %, the
    int8 model losing ``lost`` of those, a look after each batch of 100 as a pruned study makes."""
    rng = np.random.default_rng(seed)
    stopped = 0
    for _ in range(evaluations):
        fp32 = (rng.random(2000) < 0.9).astype(float)
        int8 = fp32.copy()
        int8[rng.choice(np.flatnonzero(fp32), size=lost, replace=False)] = 0.0
        looks = (acc_loss_lower_bound(fp32, int8[:n], fp32.mean()) for n in range(100, 2000, 100))
        stopped += any(bound > 0.01 for bound in looks)
    return stopped / evaluations


def test_a_model_at_the_target_is_almost_never_stopped_and_one_at_three_times_it_almost_always() -> None:
    assert _stops(lost=18, evaluations=2000, seed=0) < 0.005  # 1 % of about 1,800: on the target
    assert _stops(lost=54, evaluations=300, seed=1) > 0.9  # 3 %
