"""``stop_on_target`` across every worker of a study.

``study.stop()`` stops only the calling process, so the first worker whose trial meets both targets
writes a flag into the study's storage (a study user attr). Every worker reads it after each trial
and stops (:class:`StopOnTarget`; ``QuantStudy.optimize`` also before its first trial and after
waiting for other workers' trials), and the objective reads it before and after its measurement
and prunes the trial it is running, so each worker stops within the trial it is running when the
flag is set.

Example:
    >>> import optuna
    >>> from optuna_quant.loss import Targets
    >>> study = optuna.create_study()
    >>> callback = StopOnTarget(Targets(accuracy_loss=1.0, latency_reduce=1.2))
    >>> study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3, callbacks=[callback])
    >>> target_reached(study) is None
    True
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant.loss import Targets

TARGET_REACHED_KEY = "target_reached_by_trial"


def target_reached(study: optuna.Study) -> int | None:
    """The number of the trial that met both targets first, or ``None``."""
    return study.user_attrs.get(TARGET_REACHED_KEY)


def meets_targets(trial: FrozenTrial, targets: Targets) -> bool:
    """Whether a completed trial's recorded ``acc_loss`` and ``lat_diff`` meet both targets."""
    attrs = trial.user_attrs
    return (
        trial.state == TrialState.COMPLETE
        and "acc_loss" in attrs
        and targets.met(attrs["acc_loss"], attrs["lat_diff"])
    )


class StopOnTarget:
    """An ``optimize`` callback that stops every worker once a trial meets both targets.

    Args:
        targets: The accuracy and latency targets.
    """

    def __init__(self, targets: Targets) -> None:
        self.targets = targets

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        reached = target_reached(study)
        if reached is None and meets_targets(trial, self.targets):
            study.set_user_attr(TARGET_REACHED_KEY, trial.number)
            reached = trial.number
        if reached is not None:
            study.stop()
