"""The measured trials of a study, and which of them is the best.

:func:`recorded` keeps the trials that hold a measurement; :func:`best_trial` picks the best by
:func:`optuna_quant.measure.loss.best_index` (POT's rule while a trial keeps the accuracy);
:class:`BestResult` is that trial as a user reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant.measure.loss import best_index
from optuna_quant.measure.loss import Result
from optuna_quant.measure.loss import Targets
from optuna_quant.trial import records


def recorded(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The completed trials that carry a measurement (``acc_loss``, ``lat_diff`` and a loss)."""
    return [
        t
        for t in trials
        if t.state == TrialState.COMPLETE
        and records.measured(t)
        and t.values is not None
        and (len(t.values) == 1 or records.loss(t) is not None)
    ]


def trial_loss(trial: FrozenTrial) -> float:
    """POT's loss of a recorded trial: its value, or its ``loss`` attr in Pareto mode (two values)."""
    if len(trial.values) == 1:
        return float(trial.values[0])
    loss = records.loss(trial)
    assert loss is not None  # recorded() keeps a trial of two values only with its loss
    return float(loss)


def result_of(trial: FrozenTrial) -> Result:
    """What the best-result rule looks at in a recorded trial."""
    return Result(records.acc_loss(trial), records.lat_diff(trial), trial_loss(trial), records.quantized(trial))


def best_trial(trials: Sequence[FrozenTrial], targets: Targets) -> FrozenTrial | None:
    """The best trial (see :func:`optuna_quant.measure.loss.best_index`), or ``None``."""
    candidates = recorded(trials)
    index = best_index([result_of(t) for t in candidates], targets)
    return None if index is None else candidates[index]


@dataclass(frozen=True)
class BestResult:
    """The best trial of a run, as a user reads it.

    Attributes:
        number: The trial number.
        params: Its parameters.
        acc_loss: Relative accuracy loss against fp32.
        lat_diff: Speed-up against fp32.
        loss: POT's weighted loss.
        missed: The targets it misses (``"accuracy"``, ``"latency"``); empty when both are met.
        shortfall: By how much it misses each of them, one phrase a missed target
            (:meth:`optuna_quant.measure.loss.Targets.shortfall`).
    """

    number: int
    params: dict[str, Any]
    acc_loss: float
    lat_diff: float
    loss: float
    missed: tuple[str, ...]
    shortfall: tuple[str, ...] = ()

    @property
    def targets_met(self) -> bool:
        """Whether both targets are met."""
        return not self.missed

    @classmethod
    def from_trial(cls, trial: FrozenTrial, targets: Targets) -> BestResult:
        """The result that ``trial`` recorded."""
        acc_loss, lat_diff, quantized = records.acc_loss(trial), records.lat_diff(trial), records.quantized(trial)
        return cls(
            number=trial.number,
            params=dict(trial.params),
            acc_loss=acc_loss,
            lat_diff=lat_diff,
            loss=trial_loss(trial),
            missed=tuple(targets.missed(acc_loss, lat_diff, quantized)),
            shortfall=tuple(targets.shortfall(acc_loss, lat_diff, quantized)),
        )

    def configuration(self) -> str:
        """The best configuration, one parameter a line, as the CLI and the demo print it."""
        lines = ["Best configuration:"]
        lines += [f"  {name:24s} {value}" for name, value in sorted(self.params.items())]
        return "\n".join(lines)

    def summary(self) -> str:
        """One line in POT's terms, saying which target was missed, if any, and by how much.

        Example:
            >>> BestResult(7, {}, 0.0171, 1.21, 81.3, ("accuracy", "latency"),
            ...            tuple(Targets(1.0, 1.5).shortfall(0.0171, 1.21))).summary()
            'Best trial 7: acc_loss: 0.0171 lat_diff: 1.2100 (neither target met: accuracy missed by 0.71 points of acc_loss (1.71 % against the 1.00 % target); latency missed: 1.21x against 1.50x)'
        """
        verdict = {
            (): "targets met",
            ("latency",): "accuracy met but not latency",
            ("accuracy",): "latency met but not accuracy",
            ("accuracy", "latency"): "neither target met",
        }[self.missed]
        details = "; ".join(self.shortfall)
        return (
            f"Best trial {self.number}: acc_loss: {self.acc_loss:.4f} lat_diff: {self.lat_diff:.4f} "
            f"({verdict}{': ' + details if details else ''})"
        )
