from __future__ import annotations

import math

import pytest

from optuna_quant.loss import best_index
from optuna_quant.loss import latency_term
from optuna_quant.loss import LossScaling
from optuna_quant.loss import relative_accuracy_loss
from optuna_quant.loss import Result
from optuna_quant.loss import Targets
from optuna_quant.loss import weighted_loss


def test_relative_accuracy_loss() -> None:
    assert relative_accuracy_loss(0.8, 0.76) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="fp32 accuracy is 0"):
        relative_accuracy_loss(0.0, 0.5)


def test_latency_term_by_hand() -> None:
    # L(l) = ln((1 / (1000 l)) ** 8)
    assert latency_term(2.0) == pytest.approx(math.log((1 / 2000) ** 8))


def test_scaling_by_hand() -> None:
    t = Targets(accuracy_loss=1.0, latency_reduce=1.5)
    s = LossScaling.from_reference(0.03, 2.5, t)
    assert s.acc_min == 1
    assert s.acc_max == pytest.approx(math.exp(0.03))
    assert s.acc_scale == pytest.approx(10 / (math.exp(0.03) - 1))
    assert s.lat_max == pytest.approx(math.log((1 / 1000) ** 8))
    assert s.lat_min == pytest.approx(math.log((1 / 2500) ** 8))
    assert s.lat_scale == pytest.approx(10 / abs(math.log((1 / 1000) ** 8) - math.log((1 / 2500) ** 8)))


def test_scaling_reference_without_loss_uses_threshold() -> None:
    t = Targets(accuracy_loss=2.0)
    s = LossScaling.from_reference(0.0, 1.7, t)
    assert s.acc_max == pytest.approx(math.exp(0.02))


def test_scaling_reference_without_speedup_uses_two() -> None:
    s = LossScaling.from_reference(0.01, 1.0, Targets())
    assert s.lat_min == pytest.approx(math.log((1 / 2000) ** 8))


def test_loss_by_hand_all_branches() -> None:
    t = Targets(accuracy_loss=1.0, latency_reduce=1.5)
    s = LossScaling.from_reference(0.03, 2.0, t)
    lat = lambda lat_diff: s.lat_scale * (math.log((1 / (1000 * lat_diff)) ** 8) - s.lat_min)  # noqa: E731
    # accuracy missed: both terms and +80
    expected = s.acc_scale * (math.exp(0.02) - 1) + lat(1.8) + 80
    assert weighted_loss(0.02, 1.8, t, s) == pytest.approx(expected)
    # accuracy met, latency missed: accuracy term off, +40
    assert weighted_loss(0.005, 1.2, t, s) == pytest.approx(lat(1.2) + 40)
    # both met: latency term alone
    assert weighted_loss(0.005, 3.0, t, s) == pytest.approx(lat(3.0))


def test_loss_weights() -> None:
    t = Targets(accuracy_loss=1.0, latency_reduce=1.5, accuracy_weight=0.0, latency_weight=0.0)
    s = LossScaling.from_reference(0.03, 2.0, t)
    # both weights zero: w_a falls back to 1 and only the accuracy term counts
    assert weighted_loss(0.005, 3.0, t, s) == pytest.approx(s.acc_scale * (math.exp(0.005) - 1))
    t2 = Targets(accuracy_loss=1.0, latency_reduce=1.5, accuracy_weight=2.0)
    assert weighted_loss(0.02, 2.0, t2, s) == pytest.approx(2 * s.acc_scale * (math.exp(0.02) - 1) + 80)


def test_scaling_round_trip() -> None:
    s = LossScaling.from_reference(0.03, 2.0, Targets())
    assert LossScaling.from_dict(s.to_dict()) == s


def test_best_rule() -> None:
    t = Targets(accuracy_loss=1.0, latency_reduce=1.5)
    results = [
        Result(0.02, 3.0, 85.0),  # misses accuracy: never best while one is within it
        Result(0.005, 1.9, -3.0),
        Result(0.002, 1.9, -3.0),  # same speed, lower loss of accuracy: wins the tie
        Result(0.009, 1.4, 42.0),
    ]
    assert best_index(results, t) == 2
    assert best_index([Result(0.05, 2.0, 90.0), Result(0.03, 1.0, 88.0)], t) == 1
    assert best_index([], t) is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"accuracy_loss": -1.0}, "accuracy_loss"),
        ({"accuracy_loss": 0.0}, "accuracy_loss"),
        ({"accuracy_loss": 150.0}, "accuracy_loss"),
        ({"latency_reduce": 0.0}, "latency_reduce"),
        ({"latency_reduce": 1e6}, "latency_reduce"),
        ({"latency_weight": -1.0}, "latency_weight"),
        ({"accuracy_loss": float("nan")}, "accuracy_loss"),
        ({"accuracy_loss": "1"}, "accuracy_loss"),
    ],
)
def test_bad_targets(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Targets(**kwargs)


def test_targets_missed() -> None:
    t = Targets(accuracy_loss=1.0, latency_reduce=1.5)
    assert t.missed(0.02, 1.0) == ["accuracy", "latency"]
    assert t.missed(0.005, 1.0) == ["latency"]
    assert t.missed(0.005, 2.0) == []
    assert t.met(0.01, 1.5)
