"""Concurrent suggestions that never coincide: each trial claims its configuration, in trial order.

Workers that share a storage ask for trials at about the same time, and with the same data and
the same seed a sampler makes the same choice in each. Both samplers of this package resolve that
the same way, deterministically:

1. Before choosing, trial ``n`` waits until every *lower-numbered* running trial has made its
   choice: written a claim (below), or set its parameters, or been given fixed parameters by
   ``enqueue_trial``. The wait is bounded (:func:`wait_bound`): a trial whose worker died before
   choosing holds the others back for a few seconds at most, never past the storage's heartbeat
   grace period.
2. Trial ``n`` then reads every other trial and excludes the configurations they hold (finished
   ones, running ones with parameters, and claims of running ones that have none yet).
3. It writes its choice as a claim (a trial system attribute) before returning it.

:func:`sample_in_turn` runs these steps around a sampler's choice.

Why no two trials keep one configuration: take trials ``m < n``. Trial ``m`` writes its claim
before it sets any parameter, and trial ``n`` reads only after ``m``'s claim (or parameters) is
in the storage (step 1), so ``n`` excludes ``m``'s configuration. The lower number keeps a
configuration and the higher one chooses another, whatever the timing and the seeds; only a wait
cut short by its bound (a worker that hangs or died mid-choice) can let two coincide.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
import json
import time
from typing import Any

from optuna.storages import BaseStorage
from optuna.storages import RDBStorage
from optuna.study import Study
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant._optuna_private import cached_trials
from optuna_quant._optuna_private import fixed_params
from optuna_quant._optuna_private import set_trial_system_attr
from optuna_quant._optuna_private import storage_backend
from optuna_quant._optuna_private import study_identity
from optuna_quant._optuna_private import study_storage
from optuna_quant.samplers._discrete import Config
from optuna_quant.samplers._discrete import DiscreteSpace


CLAIM_KEY = "optuna_quant:claim"
DEFAULT_WAIT_SECONDS = 5.0
_POLL_SECONDS = 0.02
_MAX_POLL_SECONDS = 0.32
_UNFINISHED = (TrialState.RUNNING, TrialState.WAITING)


def wait_bound(storage: BaseStorage, seconds: float) -> float:
    """``seconds``, cut to the storage's heartbeat grace period where it has a heartbeat.

    Past the grace period Optuna fails a silent trial (``fail_stale_trials``), so waiting longer
    for one would wait for a trial that is already given up.

    Example:
        >>> import optuna
        >>> wait_bound(optuna.storages.InMemoryStorage(), 5.0)
        5.0
    """
    # As a study holds it, an RDBStorage is behind Optuna's cache.
    backend = storage_backend(storage)
    if isinstance(backend, RDBStorage) and backend.heartbeat_interval is not None:
        grace = backend.grace_period or 2 * backend.heartbeat_interval
        return min(seconds, float(grace))
    return seconds


def other_trials(
    study: Study, trial: FrozenTrial, names: Iterable[str], wait_seconds: float
) -> list[FrozenTrial]:
    """Every trial of ``study`` but ``trial``, read once the lower-numbered ones have chosen.

    Args:
        study: The study.
        trial: The trial being sampled.
        names: The parameters being sampled; a trial has chosen once it holds all of them.
        wait_seconds: The most to wait (see :func:`wait_bound`).
    """
    names = tuple(names)
    deadline = time.monotonic() + wait_bound(study_storage(study), wait_seconds)
    # The study's per-trial cache, read since this trial was made (a sampler's search space read
    # it, as Optuna's ask does): it holds every lower-numbered trial; what they chose since is read again.
    trials = [t for t in cached_trials(study) if t.number != trial.number]
    undecided = [
        t for t in trials if t.number < trial.number and t.state == TrialState.RUNNING and held_params(t, names) is None
    ]
    # One read of the study's unfinished trials a look (Optuna's cache keeps the finished ones): with
    # tens of workers, reading the undecided trials one row each cost more than the choice.
    storage, study_id = study_identity(study)
    poll = _POLL_SECONDS
    while undecided and time.monotonic() < deadline:
        time.sleep(poll)
        poll = min(2 * poll, _MAX_POLL_SECONDS)
        trials = [t for t in storage.get_all_trials(study_id, deepcopy=False) if t.number != trial.number]
        undecided = [
            t for t in trials if t.number < trial.number and t.state == TrialState.RUNNING and held_params(t, names) is None
        ]
    return trials


def held_params(trial: FrozenTrial, names: Sequence[str]) -> dict[str, Any] | None:
    """The values of ``names`` that ``trial`` holds or will hold; ``None`` while it has not chosen.

    Its parameters when they cover ``names``, else its claim, else the parameters fixed by
    ``enqueue_trial`` when they cover ``names``.
    """
    if all(name in trial.params for name in names):
        return trial.params
    if CLAIM_KEY in trial.system_attrs:
        return json.loads(trial.system_attrs[CLAIM_KEY])
    fixed = fixed_params(trial)
    if fixed is not None and all(name in fixed for name in names):
        return fixed
    return None


def claimed_configs(trials: Iterable[FrozenTrial], space: DiscreteSpace) -> list[Config]:
    """Configurations held by unfinished trials that have not set their parameters yet.

    Trials with their parameters set are counted by :class:`~._discrete.History` already.
    """
    claimed = []
    for t in trials:
        if t.state not in _UNFINISHED or space.encode(t.params) is not None:
            continue
        params = held_params(t, space.names)
        config = None if params is None else space.encode(params)
        if config is not None:
            claimed.append(config)
    return claimed


def sample_in_turn(
    study: Study,
    trial: FrozenTrial,
    names: Sequence[str],
    wait_seconds: float,
    choose: Callable[[list[FrozenTrial]], dict[str, Any]],
) -> dict[str, Any]:
    """The protocol: ``choose(other_trials)`` once the lower-numbered trials have chosen, claimed.

    Args:
        study: The study.
        trial: The trial being sampled.
        names: The parameters being sampled.
        wait_seconds: The most to wait for lower-numbered trials (see :func:`wait_bound`).
        choose: The sampler's choice given every other trial; it must exclude the configurations
            they hold (:func:`claimed_configs` and the trials' parameters). An empty choice
            (every configuration taken) is not claimed.
    """
    params = choose(other_trials(study, trial, names, wait_seconds))
    if params:
        set_trial_system_attr(study, trial, CLAIM_KEY, json.dumps(params))
    return params
