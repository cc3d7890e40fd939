"""The trial budget that every worker of a study shares: POT's ``max_trials`` across machines.

Each worker reserves its next trial under the study lock before it asks Optuna for one, so that
several workers end with exactly ``max_trials`` trials, never one more. A reservation is a
``WAITING`` trial that the worker's next ``ask`` pops: a free queued trial (one enqueued by the
user, or a trial re-queued because its worker died), else a new empty one (a *ticket*) while the
budget has room. A trial failed because its worker died and queued again counts once.

Example:
    >>> import optuna
    >>> from optuna_quant.storage import study_lock
    >>> storage = optuna.storages.InMemoryStorage()
    >>> study = optuna.create_study(storage=storage)
    >>> lock = study_lock(storage, study.study_name)
    >>> reserve_trial(study, storage, n_trials=1, lock=lock)
    True
    >>> study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    >>> reserve_trial(study, storage, n_trials=1, lock=lock)
    False
"""

from __future__ import annotations

from collections.abc import Sequence
import time

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant.storage import StudyLock

RESERVED_KEY = "optuna_quant:reserved"
_COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.WAITING)


def retried_numbers(trials: Sequence[FrozenTrial]) -> set[int]:
    """Numbers of the trials that failed with their worker and were queued again."""
    return {number for t in trials for number in t.system_attrs.get("retry_history", ())}


def counted_trials(trials: Sequence[FrozenTrial], running_counts: bool) -> int:
    """How many trials of the budget ``trials`` use up.

    Finished and queued trials count, a retried trial once. Running trials count only where a
    heartbeat will fail them if their worker died (``running_counts``); without one a trial left
    running by a killed worker would hold its place forever.
    """
    states = (*_COUNTED, TrialState.RUNNING) if running_counts else _COUNTED
    retried = retried_numbers(trials)
    return sum(1 for t in trials if t.state in states and t.number not in retried)


def reserve_trial(
    study: optuna.Study,
    storage: BaseStorage,
    n_trials: int | None,
    lock: StudyLock,
    stale_after: float = 60.0,
    running_counts: bool = False,
) -> bool:
    """Reserve this worker's next trial; ``False`` once the budget is used up.

    Args:
        study: The study.
        storage: The storage the study was opened on.
        n_trials: The budget (total trials of the study); ``None`` for no limit.
        lock: The study lock that every worker shares.
        stale_after: Seconds after which a reservation that was never run is free again (its
            worker died between reserving and asking).
        running_counts: Whether running trials use up the budget (see :func:`counted_trials`).
    """
    with lock():
        trials = study.get_trials(deepcopy=False)
        now = time.time()
        free = [t for t in trials if t.state == TrialState.WAITING and not _reserved(t, now, stale_after)]
        if free:
            trial_id = free[0]._trial_id
        elif n_trials is None or counted_trials(trials, running_counts) < n_trials:
            ticket = optuna.trial.create_trial(state=TrialState.WAITING, system_attrs={"fixed_params": {}})
            trial_id = storage.create_new_trial(study._study_id, template_trial=ticket)
        else:
            return False
        storage.set_trial_system_attr(trial_id, RESERVED_KEY, [trial_id, now])
        return True


def _reserved(trial: FrozenTrial, now: float, stale_after: float) -> bool:
    # A re-queued trial copies the system attrs of the one it replaces: the mark names the trial.
    # By id, not number: creating a ticket returns its id, and its number would cost a query.
    mark = trial.system_attrs.get(RESERVED_KEY)
    return mark is not None and mark[0] == trial._trial_id and now - mark[1] <= stale_after
