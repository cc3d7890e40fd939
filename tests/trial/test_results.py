"""The measured trials of a study, the best of them, and the best as a user reads it."""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState
import pytest

from optuna_quant.measure.loss import Targets
from optuna_quant.trial.results import best_trial
from optuna_quant.trial.results import BestResult
from optuna_quant.trial.results import recorded
from optuna_quant.trial.results import result_of
from optuna_quant.trial.results import trial_loss


TARGETS = Targets(accuracy_loss=1.0, latency_reduce=1.5)


def _trials(*results: tuple[float, float, float]) -> list[FrozenTrial]:
    """Loss-mode trials numbered from 0, one per ``(acc_loss, lat_diff, loss)``."""
    trials = []
    for number, (acc_loss, lat_diff, loss) in enumerate(results):
        trial = optuna.trial.create_trial(
            value=loss, params={"x": number}, distributions={"x": optuna.distributions.IntDistribution(0, 99)},
            user_attrs={"acc_loss": acc_loss, "lat_diff": lat_diff, "loss": loss},
        )
        trial.number = number
        trials.append(trial)
    return trials


def test_recorded_keeps_the_completed_trials_with_a_measurement_and_a_loss() -> None:
    measured = {"acc_loss": 0.01, "lat_diff": 1.2}
    kept = [
        optuna.trial.create_trial(value=3.0, user_attrs=measured),  # loss mode: the value is the loss
        optuna.trial.create_trial(values=[0.01, 1.2], user_attrs={**measured, "loss": 3.0}),
    ]
    dropped = [
        optuna.trial.create_trial(value=3.0),  # no measurement
        optuna.trial.create_trial(values=[0.01, 1.2], user_attrs=measured),  # Pareto mode without its loss
        optuna.trial.create_trial(state=TrialState.RUNNING, user_attrs=measured),
        optuna.trial.create_trial(state=TrialState.FAIL, user_attrs=measured),
    ]
    assert recorded(dropped + kept) == kept


def test_trial_loss_is_the_value_or_in_pareto_mode_the_loss_attr() -> None:
    single = optuna.trial.create_trial(value=2.5, user_attrs={"acc_loss": 0.0, "lat_diff": 1.0, "loss": 9.0})
    pareto = optuna.trial.create_trial(values=[0.01, 1.2], user_attrs={"acc_loss": 0.01, "lat_diff": 1.2, "loss": 3.0})
    assert trial_loss(single) == 2.5 and trial_loss(pareto) == 3.0
    assert (result_of(pareto).acc_loss, result_of(pareto).lat_diff, result_of(pareto).loss) == (0.01, 1.2, 3.0)


@pytest.mark.parametrize(
    ("results", "best"),
    [
        # Within the accuracy target the highest lat_diff wins, whatever the loss.
        ([(0.002, 1.4, -5.0), (0.009, 2.1, 1.0), (0.02, 3.0, 80.0)], 1),
        # Ties on lat_diff: the lower acc_loss; then the earlier trial.
        ([(0.008, 2.0, 0.0), (0.003, 2.0, 0.0), (0.003, 2.0, 0.0)], 1),
        # None within: the lowest acc_loss among the trials at least as fast as fp32, not the lowest loss.
        ([(0.05, 2.0, 80.5), (0.03, 1.1, 81.0), (0.02, 0.9, 85.0)], 1),
        # None as fast as fp32 either: the lowest acc_loss of all.
        ([(0.05, 0.8, 80.0), (0.03, 0.9, 81.0)], 1),
    ],
)
def test_best_trial_follows_the_rule(results: list[tuple[float, float, float]], best: int) -> None:
    found = best_trial(_trials(*results), TARGETS)
    assert found is not None and found.number == best


def test_best_trial_looks_at_recorded_trials_only() -> None:
    trials = _trials((0.005, 1.2, 1.0))
    unmeasured = optuna.trial.create_trial(value=-100.0)
    unmeasured.number = 1
    assert best_trial([*trials, unmeasured], TARGETS) is trials[0]
    assert best_trial([unmeasured], TARGETS) is None and best_trial([], TARGETS) is None


def test_best_result_says_what_the_trial_recorded_and_misses() -> None:
    met, slow = _trials((0.005, 1.6, -2.0), (0.005, 1.2, 38.0))
    result = BestResult.from_trial(met, TARGETS)
    assert (result.number, result.params, result.acc_loss, result.lat_diff, result.loss) == (0, {"x": 0}, 0.005, 1.6, -2.0)
    assert result.targets_met and result.missed == () and result.shortfall == ()
    missed = BestResult.from_trial(slow, TARGETS)
    assert not missed.targets_met and missed.missed == ("latency",)
    assert missed.shortfall == ("latency missed: 1.20x against 1.50x",)
    assert missed.summary().endswith("(accuracy met but not latency: latency missed: 1.20x against 1.50x)")
    assert missed.configuration() == "Best configuration:\n  x                        1"
