"""``stop_on_target`` from the trials alone: which trial met both targets first, the reference aside."""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState
import pytest

from optuna_quant.measure.loss import Targets
from optuna_quant.trial.records import REFERENCE_KEY
from optuna_quant.trial.stopping import meets_targets
from optuna_quant.trial.stopping import target_reached


TARGETS = Targets(accuracy_loss=1.0, latency_reduce=1.5)


def _trial(number: int, acc_loss: float | None = 0.005, lat_diff: float = 2.0, *, reference: bool = False,
           state: TrialState = TrialState.COMPLETE, quantized: bool | None = None) -> FrozenTrial:
    attrs: dict[str, object] = {} if acc_loss is None else {"acc_loss": acc_loss, "lat_diff": lat_diff}
    if quantized is not None:  # trials of earlier versions have no such attr
        attrs["quantized"] = quantized
    if reference:
        attrs[REFERENCE_KEY] = True
    trial = optuna.trial.create_trial(
        state=state, value=0.0 if state == TrialState.COMPLETE else None, user_attrs=attrs
    )
    trial.number = number
    return trial


@pytest.mark.parametrize(
    ("trial", "met"),
    [
        (_trial(0), True),
        (_trial(0, acc_loss=0.01, lat_diff=1.5), True),  # both thresholds are met when reached
        (_trial(0, acc_loss=0.011), False),
        (_trial(0, lat_diff=1.49), False),
        (_trial(0, acc_loss=None), False),  # completed without a measurement: a plain Optuna trial
        (_trial(0, state=TrialState.RUNNING), False),  # a measurement still being recorded
        (_trial(0, state=TrialState.PRUNED), False),
        (_trial(0, quantized=True), True),
        (_trial(0, quantized=False), False),  # the fp32 model: no int8 to deliver
    ],
)
def test_meets_targets_wants_a_completed_measurement_within_both(trial: FrozenTrial, met: bool) -> None:
    assert meets_targets(trial, TARGETS) is met


def test_target_reached_names_the_lowest_number_and_skips_the_reference() -> None:
    trials = [_trial(0, reference=True), _trial(4), _trial(1, lat_diff=1.0), _trial(2)]
    assert target_reached(trials, TARGETS) == 2
    assert target_reached(trials[:3], TARGETS) == 4
    assert target_reached(trials[:1], TARGETS) is None  # the reference alone is the baseline
    assert target_reached([], TARGETS) is None
