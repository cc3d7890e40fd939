"""``stop_on_target``, decided from the study's trials: no flag to write or to race on.

A trial that completed with a recorded ``acc_loss`` and ``lat_diff`` meeting both targets stops
every worker: each reads the trials before it asks for its next one (under the study lock, see
:mod:`optuna_quant.study.worker`), and the objective reads them again before it measures, pruning a
trial that would measure for nothing. The reference trial does not count: it is the baseline.

Example:
    >>> import optuna
    >>> from optuna_quant.measure.loss import Targets
    >>> study = optuna.create_study()
    >>> study.add_trial(optuna.trial.create_trial(value=0.0, user_attrs={"acc_loss": 0.001, "lat_diff": 2.0}))
    >>> target_reached(study.trials, Targets(accuracy_loss=1.0, latency_reduce=1.5))
    0
    >>> target_reached(study.trials, Targets(accuracy_loss=1.0, latency_reduce=3.0)) is None
    True
"""

from __future__ import annotations

from collections.abc import Sequence

from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant.measure.loss import Targets
from optuna_quant.trial import records


def meets_targets(trial: FrozenTrial, targets: Targets) -> bool:
    """Whether a completed trial's recorded ``acc_loss`` and ``lat_diff`` meet both targets (a
    model that quantizes nothing never does: :meth:`~optuna_quant.measure.loss.Targets.met`)."""
    return (
        trial.state == TrialState.COMPLETE
        and records.measured(trial)
        and targets.met(records.acc_loss(trial), records.lat_diff(trial), records.quantized(trial))
    )


def target_reached(trials: Sequence[FrozenTrial], targets: Targets) -> int | None:
    """The number of the first trial (by number) other than the reference that met both targets."""
    met = [t.number for t in trials if not records.is_reference(t) and meets_targets(t, targets)]
    return min(met, default=None)
