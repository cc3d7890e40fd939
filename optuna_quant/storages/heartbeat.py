"""Which workers of a study are alive, on any storage: a heartbeat kept in the trials themselves.

A running trial's worker writes a new value into the trial's system attribute
``optuna_quant:heartbeat`` every ``interval`` seconds (:meth:`Heartbeat.beating`, a daemon
thread). The other workers read it with the trials they read anyway, and a running trial whose
value a worker has seen unchanged for ``grace`` seconds of its own clock is stale
(:meth:`Heartbeat.stale`): its worker died or lost the storage. A stale trial is failed and queued
again, as Optuna's :class:`~optuna.storages.RetryHeartbeatStaleTrialCallback` queues it
(:meth:`Heartbeat.fail`), by a worker that holds the study lock.

Only Optuna's public storage API is used, so the heartbeat is the same on every storage: a
database, a journal file, a gRPC proxy. No two clocks are compared: a value is only compared for
equality, and each worker times the silence on its own monotonic clock. A trial that never beat
(its worker died inside Optuna's ask) goes stale the same way.

Example:
    >>> import optuna
    >>> study = optuna.create_study()
    >>> heartbeat = Heartbeat(interval=0.01, grace=0.05)
    >>> trial = study.ask()
    >>> with heartbeat.beating(study, trial):
    ...     pass
    >>> [t.number for t in heartbeat.stale(study.get_trials())]  # seen once: not yet stale
    []
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Hashable
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import AbstractContextManager
from contextlib import contextmanager
import logging
import threading
import time
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from optuna_quant._optuna_private import set_trial_system_attr
from optuna_quant.storages.rdb import optuna_warnings_off


HEARTBEAT_KEY = "optuna_quant:heartbeat"
STALE_KEY = "optuna_quant:stale"
HEARTBEAT_INTERVAL = 10
GRACE_PERIOD = 30
MAX_RETRY = 3
_logger = logging.getLogger("optuna_quant")


class Heartbeat:
    """The heartbeat of one worker: it beats for its own trials and watches the others'.

    Args:
        interval: Seconds between two beats of a running trial.
        grace: Seconds a running trial's heartbeat may stay unchanged before it counts as stale;
            more than ``interval``.
        max_retry: How many times a stale trial is queued again.

    Raises:
        ValueError: If ``interval`` is not positive or ``grace`` not longer than it.
    """

    def __init__(self, interval: float = HEARTBEAT_INTERVAL, grace: float = GRACE_PERIOD, max_retry: int = MAX_RETRY) -> None:
        if not 0 < interval < grace:
            raise ValueError(
                f"The heartbeat needs 0 < heartbeat_interval < grace_period, got {interval!r} and {grace!r}."
            )
        self.interval = interval
        self.grace = grace
        self.max_retry = max_retry
        self._silence = Silence()

    def beating(self, study: optuna.Study, trial: optuna.Trial | FrozenTrial) -> AbstractContextManager[None]:
        """Beat for ``trial`` while the block runs: at once, then every interval."""
        # Any new value will do: the watchers compare values, never times.
        return repeating(lambda: set_trial_system_attr(study, trial, HEARTBEAT_KEY, time.time()), self.interval)

    def stale(self, trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
        """The trials among ``trials`` that :meth:`fail` must fail or queue again: the running
        ones whose heartbeat this process has seen unchanged for the grace period, and those
        failed so whose retry was never queued (their failer died in between).

        ``trials`` must hold every trial of the study that is running or failed.
        """
        running = [t for t in trials if t.state == TrialState.RUNNING]
        self._silence.keep({t.number for t in running})
        silent = [t for t in running if self._silence.seconds(t.number, t.system_attrs.get(HEARTBEAT_KEY)) >= self.grace]
        retried = {n for t in trials for n in _retry_history(t)}
        unqueued = [
            t
            for t in trials
            if t.state == TrialState.FAIL
            and t.system_attrs.get(STALE_KEY) == t.number  # a retry's copied mark names another number
            and t.number not in retried
            and len(_retry_history(t)) < self.max_retry
        ]
        return silent + unqueued

    def fail(self, study: optuna.Study, trials: Sequence[FrozenTrial]) -> list[int]:
        """Fail the running ones of the stale ``trials`` and queue each again; the numbers of those
        this process failed or queued.

        A trial is marked stale before it is failed, so that a worker killed between the failure
        and the retry leaves one that :meth:`stale` finds. Call it under the study lock: a worker
        that decided between a trial's failure and its retry would count neither (it once queued
        a second reference).
        """
        done = []
        for trial in trials:
            if trial.state == TrialState.RUNNING:
                try:
                    set_trial_system_attr(study, trial, STALE_KEY, trial.number)
                    trial = study.tell(trial.number, state=TrialState.FAIL)
                except (UpdateFinishedTrialError, ValueError):  # it ended, or another worker failed it first
                    continue
                _logger.warning("Trial %d failed: its worker has not beaten for %s s.", trial.number, self.grace)
            queue_again(study, trial, self.max_retry)
            done.append(trial.number)
        return done


def queue_again(study: optuna.Study, failed: FrozenTrial, max_retry: int = MAX_RETRY) -> None:
    """Queue a failed trial again for any worker, at most ``max_retry`` times (Optuna's retry)."""
    with optuna_warnings_off():
        RetryHeartbeatStaleTrialCallback(max_retry=max_retry)(study, failed)


def _retry_history(trial: FrozenTrial) -> list[int]:
    with optuna_warnings_off():
        return RetryHeartbeatStaleTrialCallback.retry_history(trial)


class Silence:
    """How long each watched value has stayed as it is, on this process's monotonic clock.

    Example:
        >>> silence = Silence()
        >>> silence.seconds("lock", 1) == 0.0
        True
        >>> silence.seconds("lock", 1) > 0.0, silence.seconds("lock", 2) == 0.0
        (True, True)
    """

    def __init__(self) -> None:
        self._since: dict[Hashable, tuple[Any, float]] = {}

    def seconds(self, key: Hashable, value: Any) -> float:
        """Seconds since this process first saw ``key`` hold ``value`` (0 the first time)."""
        now = time.monotonic()
        seen = self._since.get(key)
        if seen is None or seen[0] != value:
            seen = self._since[key] = (value, now)
        return now - seen[1]

    def keep(self, keys: Collection[Hashable]) -> None:
        """Forget every key but ``keys``."""
        self._since = {key: seen for key, seen in self._since.items() if key in keys}


@contextmanager
def repeating(write: Callable[[], object], interval: float, *, at_once: bool = True) -> Iterator[None]:
    """Call ``write`` every ``interval`` seconds (first at once, unless not ``at_once``) while the
    block runs, in a daemon thread: a process killed or interrupted meanwhile is never kept alive.

    A ``write`` that raises is logged and tried again at the next interval: the storage may be back.
    """
    stop = threading.Event()

    def loop() -> None:
        if not at_once and stop.wait(interval):
            return
        while True:
            try:
                write()
            except Exception as err:
                _logger.warning("A heartbeat could not be written: %r", err)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=loop, name="optuna_quant heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
