"""Waiting on the trials of other workers, each wait bounded by the heartbeat.

:meth:`Waiter.watch` is the package's one wait: the worker loop waits in it for room in the
budget or for the reference, the objective for another worker's measurement of its
configuration.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
import logging
import time
from typing import TypeVar

import optuna
from optuna.trial import FrozenTrial

from optuna_quant.storages.heartbeat import Heartbeat
from optuna_quant.storages.lock import StudyLock


POLL_SECONDS = 0.5
_logger = logging.getLogger("optuna_quant")
T = TypeVar("T")
Look = Callable[[Sequence[FrozenTrial]], tuple[T | None, str]]
"""What a waiter calls with the trials it read: what it found, or ``None`` and what it waits for."""


class Waiter:
    """Waits on the trials of other workers, each wait bounded by the heartbeat.

    Every look reads the study's trials; the running ones whose heartbeat went stale
    (:meth:`Heartbeat.stale`) are failed and queued again first, under the study lock, so a wait on
    a dead worker's trial ends after its grace period, on a live worker's when its trial ends. The
    total of a wait is logged when it ends.

    Args:
        heartbeat: The heartbeat that tells dead workers' trials; ``None`` for a study that no
            other process can open.
        poll_seconds: Seconds between two looks.

    Example:
        >>> import optuna
        >>> from contextlib import nullcontext
        >>> looks = iter([(None, "trial 3"), ("found", "")])
        >>> Waiter(poll_seconds=0.01).watch(nullcontext, optuna.create_study(), lambda trials: next(looks))
        'found'
        >>> waiter = Waiter(poll_seconds=0.01)
        >>> waiter.beat("trial 3")
        >>> waiter.waiting, waiter.waited > 0
        (True, True)
        >>> waiter.done()
        >>> waiter.waiting
        False
    """

    def __init__(self, heartbeat: Heartbeat | None = None, poll_seconds: float = POLL_SECONDS) -> None:
        self.heartbeat = heartbeat
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

    def watch(self, lock: StudyLock, study: optuna.Study, look: Look[T], first: Sequence[FrozenTrial] | None = None) -> T:
        """Call ``look`` with the study's trials until it finds something; that.

        The looks take no lock: ``lock`` is taken only to fail stale trials and queue them again.
        ``first``, trials read already, serves the first look instead of a read of the storage.
        """
        while True:
            trials = study.get_trials(deepcopy=False) if first is None else first
            first = None
            if self.heartbeat is not None and self.heartbeat.stale(trials):
                with lock():  # read again under the lock: another worker may have failed them meanwhile
                    self.heartbeat.fail(study, self.heartbeat.stale(study.get_trials(deepcopy=False)))
                continue
            found, what = look(trials)
            if found is not None:
                self.done()
                return found
            self.beat(what)
