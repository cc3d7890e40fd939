"""No configuration measured twice: each trial claims its configuration under the study lock.

A trial whose configuration a completed trial measured copies that result; one whose
configuration another running trial claimed waits for it (:class:`~optuna_quant.storages.waiting.Waiter`),
then copies its result; otherwise it claims the configuration (:func:`optuna_quant.trial.records.claim`)
and measures it. The first claim under the lock wins, whatever the trial numbers and whenever a
queued trial is popped; a running reference trial holds the default configuration so. If the
claiming trial's worker dies, the heartbeat fails that trial and the next one claims.

The trials are read before the lock. Under it, only those that may have claimed the
configuration since are read again, one row each: the trials made since, and those that were
queued or running without a claim, holding this configuration or none yet. With tens of workers,
reading every running trial under the lock made it the study's bottleneck.

Example:
    >>> previous, seen = claim(study, trial, params, space, lock, heartbeat)   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant._optuna_private import study_identity
from optuna_quant._optuna_private import trial_id
from optuna_quant.samplers._coordination import held_params
from optuna_quant.storages.heartbeat import Heartbeat
from optuna_quant.storages.lock import StudyLock
from optuna_quant.storages.waiting import Waiter
from optuna_quant.trial import records
from optuna_quant.trial.space import SearchSpace


_UNFINISHED = (TrialState.RUNNING, TrialState.WAITING)


def claim(
    study: optuna.Study,
    trial: optuna.Trial,
    params: Mapping[str, Any],
    space: SearchSpace,
    lock: StudyLock,
    heartbeat: Heartbeat | None,
) -> tuple[FrozenTrial | None, list[FrozenTrial]]:
    """The trial that measured ``params`` already, or ``None`` once ``trial`` claimed them.

    Configurations are compared as ``space`` builds them (:meth:`SearchSpace.to_config`): params
    that differ only in a scope their approach ignores are the same configuration.

    Returns:
        That trial or ``None``, and the trials read to decide: the stop-on-target check and the
        trial's last log line reuse them.
    """
    names = list(params)
    config = space.to_config(params)
    storage, study_id = study_identity(study)

    def same(values: Mapping[str, Any]) -> bool:
        try:
            return space.to_config(values) == config
        except ValueError:  # a trial that has not set all its parameters yet
            return False

    def holds(other: FrozenTrial) -> bool | None:
        """Whether ``other`` holds ``params``; ``None`` while it has chosen nothing."""
        held = held_params(other, names)
        return None if held is None else same(held)

    def taken(trials: Sequence[FrozenTrial]) -> tuple[FrozenTrial | None, str] | None:
        """The measured trial to copy, or what to wait for; ``None`` while the configuration is free."""
        for other in trials:
            if other.state == TrialState.COMPLETE and records.measured(other) and same(other.params):
                return other, ""
        for other in trials:
            # A running reference measures the space's default configuration without a claim.
            measuring = records.is_measuring(other) or records.is_reference(other)
            if other.state == TrialState.RUNNING and measuring and holds(other):
                return None, f"trial {other.number}, which measures the same configuration"
        return None

    def since(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
        """``trials`` with those that may have claimed ``params`` since they were read, read again."""
        again = {
            t.number: storage.get_trial(trial_id(t))
            for t in trials
            if t.number != trial.number and t.state in _UNFINISHED and not records.is_measuring(t) and holds(t) is not False
        }
        fresh = [again.get(t.number, t) for t in trials]
        while True:
            try:
                made = storage.get_trial_id_from_study_id_trial_number(study_id, len(fresh))
            except KeyError:
                return fresh
            fresh.append(storage.get_trial(made))

    def look(trials: Sequence[FrozenTrial]) -> tuple[tuple[FrozenTrial | None, list[FrozenTrial]] | None, str]:
        found = taken(trials)
        if found is None:
            with lock():
                found = taken(since(trials))
                if found is None:
                    records.claim(trial)
                    return (None, list(trials)), ""
        previous, what = found
        return ((previous, list(trials)), "") if previous is not None else (None, what)

    return Waiter(heartbeat).watch(lock, study, look)
