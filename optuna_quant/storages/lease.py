"""A study lock kept in the storage itself, for storages that have no lock of their own.

The lock of study ``s`` is a queue of trials in a study of its own, ``s:optuna_quant:lock``. The
worker that moves the lowest-numbered unfinished trial of that study from waiting to running
(Optuna's pop of a queued trial, which one caller wins) holds the lock; it releases it by
finishing that trial, whose value is how long it held the lock. A worker that finds no unfinished
trial queues one. Nothing but Optuna's public storage API is used, so the lock works wherever the
workers share the storage: a journal file, a gRPC proxy (whose workers hold no database
connection).

One holder at a time: trials are queued after the existing ones only, and a finished trial never
runs again, so the lowest-numbered unfinished trial stays the lowest until it is finished, and
only one worker pops it.

A holder that dies cannot release the lock, so the lock is a lease: its holder renews a system
attribute of its trial every heartbeat interval, and a waiter that has seen that trial unchanged
for the grace period fails it (a finished trial cannot be finished twice), which frees the lock.

Example:
    >>> import optuna
    >>> from optuna_quant.storages.heartbeat import Heartbeat
    >>> lock = LeaseLock(optuna.storages.InMemoryStorage(), "demo", Heartbeat(interval=1, grace=3))
    >>> with lock():
    ...     pass
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
import logging
import random
import time

import optuna
from optuna.exceptions import DuplicatedStudyError
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant._optuna_private import trial_id
from optuna_quant.storages.heartbeat import Heartbeat
from optuna_quant.storages.heartbeat import repeating
from optuna_quant.storages.heartbeat import Silence


LEASE_KEY = "optuna_quant:lease"
LOCK_SUFFIX = ":optuna_quant:lock"
_UNFINISHED = (TrialState.WAITING, TrialState.RUNNING)
_FIRST_POLL_SECONDS = 0.005
_MAX_POLL_SECONDS = 0.2
_logger = logging.getLogger("optuna_quant")


class LeaseLock:
    """The lock of ``study_name``, a queue of trials in ``storage`` whose first its holder renews.

    Args:
        storage: The storage every worker of the study shares.
        study_name: The study.
        heartbeat: Its interval is the holder's renewal, its grace how long a waiter lets a
            lease stand unrenewed.
    """

    def __init__(self, storage: BaseStorage, study_name: str, heartbeat: Heartbeat) -> None:
        self.storage = storage
        self.name = study_name + LOCK_SUFFIX
        self.heartbeat = heartbeat
        self._study_id: int | None = None

    @contextmanager
    def __call__(self) -> Iterator[None]:
        held = trial_id(self._acquire())
        start = time.perf_counter()
        try:
            renew = lambda: self.storage.set_trial_system_attr(held, LEASE_KEY, time.time())  # noqa: E731
            with repeating(renew, self.heartbeat.interval, at_once=False):
                yield
        finally:
            try:
                self.storage.set_trial_state_values(held, TrialState.COMPLETE, [time.perf_counter() - start])
            except UpdateFinishedTrialError:  # taken over: this process was silent for the grace period
                _logger.warning("The lock %r was taken over while this worker held it.", self.name)

    def _acquire(self) -> FrozenTrial:
        study_id = self._lock_study()
        silence = Silence()
        poll = _FIRST_POLL_SECONDS
        while True:
            queued = self.storage.get_all_trials(study_id, deepcopy=False, states=_UNFINISHED)
            if not queued:
                self.storage.create_new_trial(study_id, optuna.trial.create_trial(state=TrialState.WAITING))
                continue
            first = min(queued, key=lambda t: t.number)
            if first.state == TrialState.WAITING:
                try:
                    if self.storage.set_trial_state_values(trial_id(first), TrialState.RUNNING):
                        return first
                except UpdateFinishedTrialError:
                    pass
                continue
            if silence.seconds(first.number, first.system_attrs.get(LEASE_KEY)) >= self.heartbeat.grace:
                _logger.warning("The lock %r was not renewed for %s s: its holder is dead.", self.name, self.heartbeat.grace)
                try:
                    self.storage.set_trial_state_values(trial_id(first), TrialState.FAIL)
                except UpdateFinishedTrialError:  # released meanwhile, or failed by another waiter
                    pass
                continue
            # Waiters spread out, and back off while one holder keeps the lock.
            time.sleep(poll * random.uniform(0.5, 1.5))
            poll = min(2 * poll, _MAX_POLL_SECONDS)

    def _lock_study(self) -> int:
        if self._study_id is None:
            try:
                self._study_id = self.storage.get_study_id_from_name(self.name)
            except KeyError:
                try:
                    self._study_id = self.storage.create_new_study([StudyDirection.MINIMIZE], self.name)
                except DuplicatedStudyError:  # another worker made it first
                    self._study_id = self.storage.get_study_id_from_name(self.name)
        return self._study_id
