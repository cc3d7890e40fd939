"""The worker loop: how every process that shares a study decides whether to run one more trial.

Each decision is taken under the study lock (:func:`optuna_quant.storages.lock.study_lock`) from the
study's trials alone (rules 2 to 6 are :func:`decide`), and the lock is held until Optuna has asked
for the trial, so the count that allowed it includes it for the next worker:

1. fail the trials of dead workers (Optuna's heartbeat: they are queued again);
2. stop at the deadline, or once a trial met both targets (``stop_on_target``);
3. until the reference stored its scaling: wait while it runs, pop it (or a trial the user
   queued) if one is queued, queue it if it is missing and the budget has room;
4. pop a queued trial (a retry of a dead worker's trial counts once in the budget);
5. run a new trial while the budget (``n_trials``, the study's total over every worker: finished,
   running and queued trials) has room;
6. otherwise wait while other workers' trials run (one of them may die and be queued again), or
   stop.

Every wait is :class:`optuna_quant.storages.waiting.Waiter`'s: it ends when the trial waited on ends, or
once its worker's heartbeat is stale for the grace period.

Example:
    >>> Worker(study, storage, objective, lock, n_trials=40).run()   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from contextlib import ExitStack
import enum
import logging
import time
from typing import Any

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial
from optuna.trial import TrialState
from tqdm import tqdm

from optuna_quant._optuna_private import record_first_heartbeat
from optuna_quant._optuna_private import stop_orphan_heartbeats
from optuna_quant.measure.loss import Targets
from optuna_quant.storages.lock import StudyLock
from optuna_quant.storages.rdb import MAX_RETRY
from optuna_quant.storages.rdb import optuna_warnings_off
from optuna_quant.storages.waiting import Waiter
from optuna_quant.trial import guidance
from optuna_quant.trial import records
from optuna_quant.trial.objective import QuantizationObjective
from optuna_quant.trial.reference import check_baseline
from optuna_quant.trial.reference import ReferenceMeasurementError
from optuna_quant.trial.results import best_trial
from optuna_quant.trial.stopping import target_reached


_logger = logging.getLogger("optuna_quant")
_COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING)


class Step(enum.Enum):
    """What a worker does next."""

    RUN = "run"
    """Ask for a trial: Optuna pops a queued one first."""
    QUEUE_REFERENCE = "queue_reference"
    """Queue the reference trial, then ask for it."""
    WAIT = "wait"
    """Look again after a beat (:class:`optuna_quant.storages.waiting.Waiter`)."""
    STOP = "stop"
    """Run no more trials."""


def retried_numbers(trials: Sequence[FrozenTrial]) -> set[int]:
    """Numbers of the trials that failed with their worker and were queued again."""
    with optuna_warnings_off():
        return {n for t in trials for n in RetryHeartbeatStaleTrialCallback.retry_history(t)}


def counted_trials(trials: Sequence[FrozenTrial]) -> int:
    """How many trials of the budget ``trials`` use up: every one, a retried trial once.

    Running trials count: one whose worker died is failed by the heartbeat and queued again, and
    its retry takes its place.
    """
    retried = retried_numbers(trials)
    return sum(1 for t in trials if t.state in _COUNTED and t.number not in retried)


def _newly_running(before: Sequence[FrozenTrial], now: Sequence[FrozenTrial]) -> int | None:
    """The number of the trial that is RUNNING in ``now`` and was not in ``before``, if any.

    Example:
        >>> waiting = optuna.trial.create_trial(state=TrialState.WAITING)
        >>> running = optuna.trial.create_trial(state=TrialState.RUNNING)
        >>> waiting.number, running.number = 3, 3
        >>> _newly_running([waiting], [running]), _newly_running([running], [running])
        (3, None)
    """
    was_running = {t.number for t in before if t.state == TrialState.RUNNING}
    return next((t.number for t in now if t.state == TrialState.RUNNING and t.number not in was_running), None)


def decide(
    trials: Sequence[FrozenTrial],
    n_trials: int | None,
    *,
    reference_stored: bool,
    past_deadline: bool = False,
    stop_targets: Targets | None = None,
) -> tuple[Step, str]:
    """Rules 2 to 6 of the module's docstring: the next step of a worker, from the study's trials.

    Args:
        trials: Every trial of the study, read under the study lock.
        n_trials: The study's total trials; ``None`` for no limit.
        reference_stored: Whether the reference stored its loss scaling.
        past_deadline: Whether the worker's timeout has passed.
        stop_targets: The targets whose first trial to meet both stops the study
            (``stop_on_target``); ``None`` not to stop on them.

    Returns:
        The step, and what a :attr:`Step.WAIT` waits for.

    Example:
        >>> queued = optuna.trial.create_trial(state=TrialState.WAITING)
        >>> decide([queued], n_trials=1, reference_stored=True)
        (<Step.RUN: 'run'>, '')
        >>> decide([], n_trials=1, reference_stored=False)
        (<Step.QUEUE_REFERENCE: 'queue_reference'>, '')
    """
    if past_deadline:
        return Step.STOP, ""
    if stop_targets is not None and target_reached(trials, stop_targets) is not None:
        return Step.STOP, ""
    room = n_trials is None or counted_trials(trials) < n_trials
    waiting = any(t.state == TrialState.WAITING for t in trials)
    if not reference_stored:
        running = [t.number for t in trials if t.state == TrialState.RUNNING and records.is_reference(t)]
        # A running reference first: a second queued one (a retry beside a fresh one) waits, and
        # runs once the scaling is stored, as an ordinary copy of the first.
        if running:
            return Step.WAIT, f"the reference trial {running[0]}"
        # A queued reference is popped; so is a trial the user queued, whose objective measures
        # the reference before it.
        if waiting:
            return Step.RUN, ""
        return (Step.QUEUE_REFERENCE, "") if room else (Step.STOP, "")
    if room or waiting:
        return Step.RUN, ""
    running = [t.number for t in trials if t.state == TrialState.RUNNING]
    if running:
        return Step.WAIT, f"running trial(s) {running} of other workers"
    return Step.STOP, ""


class Worker:
    """Runs trials of a shared study until its budget is used, its deadline passed or a target met.

    Args:
        study: The study.
        storage: The storage the study was opened on.
        objective: The quantization objective.
        lock: The study lock every worker shares.
        n_trials: The study's total trials (POT's ``max_trials``); ``None`` for no limit.
        timeout: Seconds after which no trial starts (POT's ``max_minutes * 60``).
        callbacks: Optuna ``optimize`` callbacks, called after each trial (each trial is one
            ``study.optimize`` call: ``study.stop()`` in a callback does not end this loop).
        show_progress_bar: Show trial k of N, the best result so far and the time left.
    """

    def __init__(
        self,
        study: optuna.Study,
        storage: optuna.storages.BaseStorage,
        objective: QuantizationObjective,
        lock: StudyLock,
        n_trials: int | None,
        timeout: float | None = None,
        callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]] = (),
        show_progress_bar: bool = False,
    ) -> None:
        self.study = study
        self.storage = storage
        self.objective = objective
        self.lock = lock
        self.n_trials = n_trials
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.callbacks = list(callbacks)
        self.bar = tqdm(total=n_trials, disable=not show_progress_bar, unit="trial")
        self.waiter = Waiter()

    def run(self) -> None:
        """Run trials until the study needs no more from this worker.

        Raises:
            ReferenceMeasurementError: If the reference cannot be measured.
            KeyboardInterrupt: Re-raised once the interrupted trial is failed and queued again.
        """
        if records.reference_scaling(self.study) is None:
            check_baseline(self.objective.measurer)  # before any trial: a failing eval_fn leaves none
        with self.bar:
            while True:
                (step, trials), held = self.waiter.until(self.lock, self.study, self._look, fail_stale=True)
                if step == Step.STOP:
                    held.close()
                    return
                self._take_prior()
                # Optuna asks for the trial under the lock; the objective releases it.
                self._run_one(held, trials)

    def _look(self) -> tuple[tuple[Step, list[FrozenTrial]] | None, str]:
        trials = self.study.get_trials(deepcopy=False)
        self._show(trials)
        step, waiting_on = decide(
            trials,
            self.n_trials,
            reference_stored=records.reference_scaling(self.study) is not None,
            past_deadline=self.deadline is not None and time.monotonic() >= self.deadline,
            stop_targets=self.objective.targets if self.objective.settings.stop_on_target else None,
        )
        if step == Step.WAIT:
            return None, waiting_on
        if step == Step.QUEUE_REFERENCE:
            records.enqueue_reference(self.study, self.objective.space.default_params())
        return (step, trials), ""

    def _take_prior(self) -> None:
        """Give the sampler the study's prior as it stands: the measured one, and the choices any
        worker learnt to fail."""
        objective = self.objective
        guidance.set_prior(self.study.sampler, self.study, objective.targets, objective.space, objective.settings.guided)

    def _run_one(self, lock: ExitStack, before: Sequence[FrozenTrial]) -> None:
        asked: list[optuna.Trial] = []
        reference_error: list[ReferenceMeasurementError] = []

        def objective(trial: optuna.Trial) -> Any:
            asked.append(trial)  # first: a Ctrl-C from here on queues the trial again
            record_first_heartbeat(self.storage, trial)  # a kill from here on fails the trial
            lock.close()
            try:
                return self.objective.run(trial, self.n_trials)
            except ReferenceMeasurementError as err:
                reference_error.append(err)
                raise

        try:
            self.study.optimize(objective, n_trials=1, catch=(Exception,), callbacks=self.callbacks)
        except KeyboardInterrupt:
            # Before the objective ran (in Optuna's ask: the sampler), the lock is still held and
            # the asked trial is the one that became RUNNING under it.
            number = asked[0].number if asked else _newly_running(before, self.study.get_trials(deepcopy=False))
            lock.close()
            stop_orphan_heartbeats()  # a Ctrl-C in Optuna's heartbeat entry would keep the process alive
            if number is not None:
                self._requeue(number)
            raise
        finally:
            lock.close()  # when Optuna's ask itself failed
        if reference_error:
            raise reference_error[0]

    def _requeue(self, number: int) -> None:
        """Fail and queue again a trial interrupted here (Ctrl-C), as the heartbeat does a dead worker's."""
        # Under the lock, as the heartbeat's retries: no worker decides between the FAIL and the retry.
        with self.lock():
            trial = self.study.get_trials(deepcopy=False)[number]
            if trial.state == TrialState.RUNNING:
                # Interrupted before Optuna's heartbeat began (in the ask) or while Optuna told the
                # result: a trial with no heartbeat is never failed as stale, and others would wait on it.
                trial = self.study.tell(number, state=TrialState.FAIL)
            if trial.state == TrialState.FAIL:
                with optuna_warnings_off():
                    RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)(self.study, trial)
            _logger.info("Trial %d was interrupted: queued again for the next worker.", number)

    def _show(self, trials: list[FrozenTrial]) -> None:
        if self.bar.disable:
            return
        self.bar.n = counted_trials(trials)
        postfix: dict[str, str] = {}
        best = best_trial(trials, self.objective.targets)
        if best is not None:
            postfix["acc_loss"] = f"{records.acc_loss(best):.4f}"
            postfix["lat_diff"] = f"{records.lat_diff(best):.4f}"
        if self.deadline is not None:
            postfix["time left"] = f"{max(0.0, self.deadline - time.monotonic()) / 60:.1f} min"
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.refresh()
