"""Waiting on the trials of other workers, each wait bounded by Optuna's heartbeat.

:meth:`Waiter.until` is the one wait of the package: the worker loop waits in it for room in the
budget or for the reference, the objective for another worker's measurement of its
configuration.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
import datetime
import logging
import time
from typing import TypeVar

import optuna

from optuna_quant._optuna_private import fail_never_beaten
from optuna_quant._optuna_private import study_storage
from optuna_quant.storages.lock import StudyLock
from optuna_quant.storages.rdb import grace_period
from optuna_quant.storages.rdb import optuna_warnings_off


POLL_SECONDS = 0.5
_logger = logging.getLogger("optuna_quant")
T = TypeVar("T")


class Waiter:
    """Waits on the trials of other workers, each wait bounded by Optuna's heartbeat.

    The caller looks again under the study lock after every beat, failing the trials whose
    heartbeat stopped for the storage's grace period first (:func:`fail_stale_trials`), so a wait
    on a dead worker's trial ends after that grace period; on a live worker's, when its trial
    ends. The total of a wait is logged when it ends.

    Args:
        poll_seconds: Seconds between two looks.

    Example:
        >>> import optuna
        >>> from contextlib import nullcontext
        >>> looks = iter([(None, "trial 3"), ("found", "")])
        >>> found, held = Waiter(poll_seconds=0.01).until(nullcontext, optuna.create_study(), lambda: next(looks))
        >>> held.close()
        >>> found
        'found'
        >>> waiter = Waiter(poll_seconds=0.01)
        >>> waiter.beat("trial 3")
        >>> waiter.waiting, waiter.waited > 0
        (True, True)
        >>> waiter.done()
        >>> waiter.waiting
        False
    """

    def __init__(self, poll_seconds: float = POLL_SECONDS) -> None:
        self.poll_seconds = poll_seconds
        self.what: str | None = None
        self.since = 0.0

    @property
    def waiting(self) -> bool:
        """Whether a wait is under way (a beat since the last :meth:`done`)."""
        return self.what is not None

    @property
    def waited(self) -> float:
        """Seconds of the wait under way (0 when none is)."""
        return time.monotonic() - self.since if self.waiting else 0.0

    def beat(self, what: str) -> None:
        """Wait one poll for ``what``."""
        if self.what is None:
            self.what, self.since = what, time.monotonic()
            _logger.info("Waiting for %s.", what)
        time.sleep(self.poll_seconds)

    def done(self) -> None:
        """End the wait under way, logging how long it took."""
        if self.what is not None:
            _logger.info("Waited %.1f s for %s.", self.waited, self.what)
            self.what = None

    def until(
        self,
        lock: StudyLock,
        study: optuna.Study,
        look: Callable[[], tuple[T | None, str]],
        *,
        fail_stale: bool = False,
    ) -> tuple[T, ExitStack]:
        """Call ``look`` under ``lock`` until it finds something; that, with the lock still held.

        ``look`` returns what it found, or ``None`` and what it waits for. Before each look the
        trials of dead workers are failed (:func:`fail_stale_trials`) while a wait is under way,
        or every time with ``fail_stale``, so no wait outlasts a dead worker's grace period.

        Returns:
            What ``look`` found, and the held lock: close it once done with what was read.
        """
        while True:
            held = ExitStack()
            held.enter_context(lock())
            try:
                if fail_stale or self.waiting:
                    # A trial that never beat holds up only a worker that waits: the budget counts it.
                    fail_stale_trials(study, never_beaten=self.waiting)
                found, what = look()
            except BaseException:
                held.close()
                raise
            if found is not None:
                self.done()
                return found, held
            held.close()
            self.beat(what)


def fail_stale_trials(study: optuna.Study, *, never_beaten: bool = True) -> None:
    """Fail (and queue again) the running trials whose worker stopped beating; see Optuna's.

    With ``never_beaten``, also those that never beat and started more than the grace period ago
    (one more storage transaction: a worker asks for it while it waits). Optuna skips a trial
    without a heartbeat, and a worker SIGKILLed after Optuna's ask created its trial, before the
    first heartbeat (the sampler's ``before_trial`` runs in between), left one running for ever:
    every other worker waited on it once the budget was used. A worker asks and writes that first
    heartbeat under the study lock, so no live worker of optuna-quant is in between while the
    caller holds it; the grace period spares a trial that an Optuna process outside optuna-quant's
    workers is still asking for. The trial's start is stamped by the asking machine's clock and
    compared with this one's: a clock ahead of this one's delays the failure by as much.

    Call it under the study lock: between failing a trial and queueing its retry, a worker that
    decided from the study's trials would see neither (it once queued a second reference).
    """
    with optuna_warnings_off():
        optuna.storages.fail_stale_trials(study)
        grace = grace_period(study_storage(study))
        if never_beaten and grace is not None:
            fail_never_beaten(study, started_before=datetime.datetime.now() - datetime.timedelta(seconds=grace))
