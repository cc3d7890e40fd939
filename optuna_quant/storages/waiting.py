"""Waiting on the trials of other workers, each wait bounded by the heartbeat.

:class:`Waiter` is the package's one wait: the worker loop waits in it for room in the budget or
for the reference (:meth:`Waiter.until`, under the study lock), the objective for another
worker's measurement of its configuration (:meth:`Waiter.watch`, without it).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from contextlib import ExitStack
import logging
import time
from typing import TypeVar

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

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
        >>> found, held = Waiter(poll_seconds=0.01).until(nullcontext, optuna.create_study(), lambda trials: next(looks))
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

    def until(self, lock: StudyLock, study: optuna.Study, look: Look[T]) -> tuple[T, ExitStack]:
        """Call ``look`` with the study's trials under ``lock`` until it finds something; that,
        with the lock still held.

        Returns:
            What ``look`` found, and the held lock: close it once done with what was read.
        """
        while True:
            held = ExitStack()
            held.enter_context(lock())
            try:
                trials = study.get_trials(deepcopy=False)
                if self._fail_stale(study, trials):
                    trials = study.get_trials(deepcopy=False)
                found, what = look(trials)
            except BaseException:
                held.close()
                raise
            if found is not None:
                self.done()
                return found, held
            held.close()
            self.beat(what)

    def watch(
        self, lock: StudyLock, study: optuna.Study, look: Look[T], states: Container[TrialState] | None = None
    ) -> T:
        """Call ``look`` with the study's trials (those in ``states``) until it finds something.

        The looks take no lock: ``lock`` is taken only to fail stale trials. ``states`` must hold
        :attr:`TrialState.RUNNING`.
        """
        while True:
            trials = study.get_trials(deepcopy=False, states=states)
            if self.heartbeat is not None and self.heartbeat.stale(trials):
                with lock():
                    self._fail_stale(study, study.get_trials(deepcopy=False))
                continue
            found, what = look(trials)
            if found is not None:
                self.done()
                return found
            self.beat(what)

    def _fail_stale(self, study: optuna.Study, trials: Sequence[FrozenTrial]) -> bool:
        """Fail and queue again the stale trials among ``trials`` (under the study lock): whether any was."""
        if self.heartbeat is None:
            return False
        stale = self.heartbeat.stale(trials)
        return bool(stale) and bool(self.heartbeat.fail(study, stale))
