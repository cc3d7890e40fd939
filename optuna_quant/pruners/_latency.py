"""A pruner for the timing blocks of a trial: a model slower than the best one within target stops early."""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant.measure.loss import weighted_loss
from optuna_quant.trial import records
from optuna_quant.trial.results import best_trial


class LatencyPruner(optuna.pruners.BasePruner):
    """Prune a trial once every timing block so far puts its loss above the best model's within target.

    A :class:`~optuna_quant.trial.objective.QuantizationObjective` with ``prune=True`` reports, after
    each timed block, POT's loss of the trial's model at that block's ``lat_diff``
    (:meth:`optuna.Trial.report`, one step a block). Within the accuracy target the loss falls as
    ``lat_diff`` rises, so a trial whose most favourable block is still above the bar, the loss
    of the best trial within target at ``(1 - margin)`` of its ``lat_diff``, is slower than that
    model by more than ``margin`` in every block: it cannot win, and its remaining blocks are not
    timed. A model over the accuracy target carries POT's penalty of 80 in every block and is
    pruned at the first step it may be. Nothing is pruned before the study holds a model within
    target, nor before ``n_warmup_steps`` blocks, nor in a study that
    :func:`optuna_quant.create_study` did not make (it stores the targets and the scaling read here).

    Args:
        n_warmup_steps: Blocks timed before a trial may be pruned.
        margin: How much slower than the best model, as a fraction of its ``lat_diff``, every
            block must be.

    Raises:
        ValueError: If ``n_warmup_steps`` is not a positive integer or ``margin`` not in [0, 1).

    Example:
        >>> study = optuna_quant.create_study(model, calib, eval_fn)   # doctest: +SKIP
        >>> isinstance(study.study.pruner, LatencyPruner)               # doctest: +SKIP
        True
    """

    def __init__(self, n_warmup_steps: int = 3, margin: float = 0.02) -> None:
        if isinstance(n_warmup_steps, bool) or not isinstance(n_warmup_steps, int) or n_warmup_steps < 1:
            raise ValueError(f"n_warmup_steps must be a positive integer, got {n_warmup_steps!r}.")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < 1:
            raise ValueError(f"margin must lie in [0, 1), got {margin!r}.")
        self.n_warmup_steps = n_warmup_steps
        self.margin = float(margin)
        self._bar: tuple[int, float | None] | None = None  # (trial number, bar): read once a trial

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        """Whether ``trial``'s blocks so far all lie above the bar (see the class)."""
        if len(trial.intermediate_values) < self.n_warmup_steps:
            return False
        bar = self.bar(study, trial.number)
        return bar is not None and min(trial.intermediate_values.values()) > bar

    def bar(self, study: optuna.Study, number: int) -> float | None:
        """The loss a block must beat for trial ``number`` to go on, or ``None`` while nothing bounds it.

        Read from the study once per trial: the best trial may change while another one is timed,
        and the next trial reads it again.
        """
        if self._bar is None or self._bar[0] != number:
            self._bar = (number, self._read_bar(study))
        return self._bar[1]

    def _read_bar(self, study: optuna.Study) -> float | None:
        stored = records.reference_scaling(study)
        targets = records.stored_targets(study)
        if stored is None or targets is None:
            return None
        best = best_trial(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), targets)
        if best is None or not records.quantized(best) or not targets.accuracy_met(records.acc_loss(best)):
            return None
        slower = records.lat_diff(best) * (1.0 - self.margin)
        return weighted_loss(records.acc_loss(best), slower, targets, stored[1])
