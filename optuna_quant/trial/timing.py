"""Where a study's time went: how long it took to its best model, and on what.

Read from the stored trials alone (their start and end times and the seconds each measurement
recorded), so it covers every worker of a shared study and a study loaded later:

- **quantize**, **evaluate**, **time**: what the trials' measurements spent building their
  models, in ``eval_fn`` and timing them (the fp32 baseline in the reference's);
- **sensitivity**: the one-off measurement that guides the search (:mod:`optuna_quant.study.guiding`);
- **other**: the rest of the wall time: the sampler, the storage, waiting on other workers;

and how many trials were pruned once measured in part (their timing or evaluation stopped early:
``create_study(pruning=True)``).

With several workers the trials' seconds add up to more than the wall time; ``other`` is then 0.

Example:
    >>> print(study.time_report().summary())   # doctest: +SKIP
    Best model (trial 3) after 41.2 s of 310.5 s: quantize 20.1 s, evaluate 80.3 s, time 150.2 s, ...
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant.trial import records


@dataclass(frozen=True)
class TimeReport:
    """How long a study took, to its best model and in all, and where the time went.

    Attributes:
        wall_seconds: From the first trial's start to the last trial's end.
        to_best_seconds: From the first trial's start to the end of the best trial; ``None``
            without one.
        best_number: The best trial's number, or ``None``.
        quantize_seconds: Building the int8 models (calibration included).
        evaluate_seconds: In ``eval_fn``.
        timing_seconds: Timing the models against fp32.
        sensitivity_seconds: The sensitivity measurement.
        pruned: Trials pruned with a measurement in part (copies of one included).
        trials: Trials that ran, the pruned ones included.
    """

    wall_seconds: float
    to_best_seconds: float | None
    best_number: int | None
    quantize_seconds: float
    evaluate_seconds: float
    timing_seconds: float
    sensitivity_seconds: float
    pruned: int = 0
    trials: int = 0

    @property
    def other_seconds(self) -> float:
        """The wall time that no measurement accounts for (0 where workers overlapped)."""
        spent = self.quantize_seconds + self.evaluate_seconds + self.timing_seconds + self.sensitivity_seconds
        return max(0.0, self.wall_seconds - spent)

    def summary(self) -> str:
        """One line: the time to the best model, the wall time, and where it went."""
        best = (
            "No best model"
            if self.to_best_seconds is None
            else f"Best model (trial {self.best_number}) after {self.to_best_seconds:.1f} s"
        )
        return (
            f"{best} of {self.wall_seconds:.1f} s: quantize {self.quantize_seconds:.1f} s, "
            f"evaluate {self.evaluate_seconds:.1f} s, time {self.timing_seconds:.1f} s, "
            f"sensitivity {self.sensitivity_seconds:.1f} s, other {self.other_seconds:.1f} s"
            + (f"; {self.pruned} of {self.trials} trials pruned" if self.pruned else "")
        )


def time_report(trials: Sequence[FrozenTrial], best: FrozenTrial | None, sensitivity_seconds: float) -> TimeReport:
    """The :class:`TimeReport` of a study's ``trials`` whose best is ``best``.

    Args:
        trials: The study's trials.
        best: Its best trial (:func:`optuna_quant.trial.results.best_trial`), if any.
        sensitivity_seconds: What its sensitivity measurement took.
    """
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    ends = [t.datetime_complete for t in trials if t.datetime_complete is not None]
    if not starts or not ends:
        return TimeReport(0.0, None, None, 0.0, 0.0, 0.0, sensitivity_seconds)
    first = min(starts)
    to_best = None
    if best is not None and best.datetime_complete is not None:
        to_best = (best.datetime_complete - first).total_seconds()
    spent = [records.seconds_spent(t) for t in trials]
    return TimeReport(
        wall_seconds=(max(ends) - first).total_seconds(),
        to_best_seconds=to_best,
        best_number=None if best is None else best.number,
        quantize_seconds=sum(s[0] for s in spent),
        evaluate_seconds=sum(s[1] for s in spent),
        timing_seconds=sum(s[2] for s in spent),
        sensitivity_seconds=sensitivity_seconds,
        pruned=sum(t.state == TrialState.PRUNED and records.measured(t) for t in trials),
        trials=sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials),
    )
