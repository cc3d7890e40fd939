from __future__ import annotations

import math

import pytest

from optuna_quant.measure.loss import best_index
from optuna_quant.measure.loss import latency_term
from optuna_quant.measure.loss import LossScaling
from optuna_quant.measure.loss import relative_accuracy_loss
from optuna_quant.measure.loss import Result
from optuna_quant.measure.loss import SPEEDUP_NOISE
from optuna_quant.measure.loss import Targets
from optuna_quant.measure.loss import weighted_loss


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


def pot_lat_scale(lat_diff: float) -> float:
    """POT's latency scale, ``10 / |L(1) - L(l0)|``, written out."""
    return 10 / abs(math.log((1 / 1000) ** 8) - math.log((1 / (1000 * lat_diff)) ** 8))


@pytest.mark.parametrize("l0", [0.25, 0.5, 0.9, SPEEDUP_NOISE, 1.5, 2.45, 4.0])
def test_scaling_is_pots_outside_the_noise_band(l0: float) -> None:
    s = LossScaling.from_reference(0.01, l0, Targets())
    assert s.lat_min == latency_term(l0)
    assert s.lat_scale == pytest.approx(pot_lat_scale(l0), rel=1e-12)


@pytest.mark.parametrize("l0", [1.006, 0.995, 1.09, 1 / 1.09])
def test_reference_near_fp32_speed_is_scaled_as_pots_no_speedup(l0: float, caplog: pytest.LogCaptureFixture) -> None:
    s = LossScaling.from_reference(0.01, l0, Targets())
    assert s == LossScaling.from_reference(0.01, 1.0, Targets())
    assert s.lat_scale == pytest.approx(10 / (8 * math.log(2)))
    assert "within 10 % of fp32's speed" in caplog.text
    assert pot_lat_scale(1.006) > 200  # what POT's formula gives the recognizer's reference ...
    assert LossScaling.from_reference(0.01, 1.006, Targets()).lat_scale < 2  # ... and the guard


def test_guard_stops_a_hundredth_of_speedup_outweighing_accuracy() -> None:
    # The text recognizer: the reference lost all its accuracy and ran at 1.006x. Both trials miss
    # the accuracy target; one is 4 % faster but loses 28.7 % against 8.1 %.
    t = Targets(accuracy_loss=1.0, latency_reduce=1.5)
    fast, accurate = (0.287, 1.25), (0.081, 1.20)
    guarded = LossScaling.from_reference(1.0, 1.006, t)
    pot = LossScaling(**{**guarded.to_dict(), "lat_min": latency_term(1.006), "lat_scale": pot_lat_scale(1.006)})
    assert weighted_loss(*fast, t, pot) < weighted_loss(*accurate, t, pot)
    assert weighted_loss(*accurate, t, guarded) < weighted_loss(*fast, t, guarded)


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


def test_best_without_accuracy_is_the_closest_usable() -> None:
    t = Targets(accuracy_loss=1.0, latency_reduce=1.5)
    results = [
        Result(0.287, 1.25, 80.5),  # lowest loss, far from the accuracy target
        Result(0.081, 1.20, 81.0),
        Result(0.081, 1.22, 81.0),  # as close, faster: wins the tie
        Result(0.020, 0.90, 95.0),  # closest of all, but slower than fp32
    ]
    assert best_index(results, t) == 2
    # none as fast as fp32: the closest of all
    assert best_index([Result(0.05, 0.9, 90.0), Result(0.03, 0.8, 92.0)], t) == 1


def test_the_fp32_model_is_best_only_when_nothing_else_was_measured() -> None:
    t = Targets(accuracy_loss=1.0, latency_reduce=1.0)
    fp32_model = Result(0.0, 1.002, -1.0, quantized=False)  # within both, by timing noise
    slower_int8 = Result(0.004, 0.93, 3.0)
    assert best_index([fp32_model, slower_int8], t) == 1
    assert best_index([fp32_model], t) == 0
    assert not t.met(0.0, 1.002, quantized=False) and t.missed(0.0, 1.002, quantized=False) == ["latency"]
    scaling = LossScaling.from_reference(0.02, 1.2, t)
    assert weighted_loss(0.0, 1.002, t, scaling, quantized=False) == weighted_loss(0.0, 1.002, t, scaling) + 40.0


def test_shortfall_says_by_how_much() -> None:
    t = Targets(accuracy_loss=1.0, latency_reduce=1.5)
    assert t.shortfall(0.0171, 1.21) == [
        "accuracy missed by 0.71 points of acc_loss (1.71 % against the 1.00 % target)",
        "latency missed: 1.21x against 1.50x",
    ]
    assert t.shortfall(0.004, 0.8) == ["latency missed: 0.80x against 1.50x, slower than fp32"]
    assert t.shortfall(0.01, 1.5) == []


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
