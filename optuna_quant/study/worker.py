"""The worker loop: how every process that shares a study decides whether to run one more trial.

Each decision is taken from the study's trials alone (rules 2 to 6 are :func:`decide`); the trial
it runs is then popped or made under the study lock
(:func:`optuna_quant.storages.lock.study_lock`), provided the budget still has room with the
trials that other workers made since the read, so that the count that allowed it includes it for
the next worker. The lock is held for a few storage calls of one row each; then the trial beats
(:class:`optuna_quant.storages.heartbeat.Heartbeat`) while its objective runs:

1. fail the trials of dead workers (their heartbeat went stale: they are queued again);
2. stop at the deadline once the reference stored its scaling (a study ends with a model, never
   with nothing: the reference runs whatever the deadline), or once a trial met both targets
   (``stop_on_target``);
3. until the reference stored its scaling: wait while it runs, pop it (or a trial the user
   queued) if one is queued, queue it if it is missing and the budget has room;
4. pop a queued trial (a retry of a dead worker's trial counts once in the budget): the
   reference's worker queued the recipes (:mod:`optuna_quant.trial.recipes`);
5. run a new trial while the budget (``n_trials``, the study's total over every worker: finished,
   running and queued trials) has room; in a guided study, the first worker to get here measures
   the sensitivity before it (:mod:`optuna_quant.study.guiding`);
6. otherwise wait while other workers' trials run (one of them may die and be queued again), or
   stop.

Every wait is :class:`optuna_quant.storages.waiting.Waiter`'s: it ends when the trial waited on ends, or
once its worker's heartbeat is stale for the grace period.

Example:
    >>> Worker(study, storage, objective, lock, Heartbeat(), n_trials=40).run()   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from contextlib import AbstractContextManager
from contextlib import nullcontext
import enum
import logging
import time
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial
from optuna.trial import TrialState
from tqdm import tqdm

from optuna_quant._optuna_private import clear_trials_cache
from optuna_quant._optuna_private import log_completed_trial
from optuna_quant._optuna_private import study_identity
from optuna_quant._optuna_private import trial_id
from optuna_quant._optuna_private import TRIAL_LINE_LOGGERS
from optuna_quant.measure.loss import Targets
from optuna_quant.storages.heartbeat import Heartbeat
from optuna_quant.storages.heartbeat import MAX_RETRY
from optuna_quant.storages.heartbeat import queue_again
from optuna_quant.storages.lock import StudyLock
from optuna_quant.storages.rdb import optuna_warnings_off
from optuna_quant.storages.waiting import Waiter
from optuna_quant.study import guiding
from optuna_quant.trial import guidance
from optuna_quant.trial import records
from optuna_quant.trial.objective import QuantizationObjective
from optuna_quant.trial.reference import check_baseline
from optuna_quant.trial.reference import ReferenceMeasurementError
from optuna_quant.trial.results import best_trial
from optuna_quant.trial.stopping import target_reached


_logger = logging.getLogger("optuna_quant")
# Where optimize logs a pruned or failed trial: logs.compact_trial_lines sums up its parameters there.
_optuna_logger = logging.getLogger(TRIAL_LINE_LOGGERS[1])
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
        past_deadline: Whether the worker's timeout has passed: it stops, once the reference is
            stored or runs in another worker.
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
        >>> decide([], n_trials=1, reference_stored=False, past_deadline=True)  # a study ends with a model
        (<Step.QUEUE_REFERENCE: 'queue_reference'>, '')
    """
    if past_deadline and reference_stored:
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
            return (Step.STOP, "") if past_deadline else (Step.WAIT, f"the reference trial {running[0]}")
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
        heartbeat: This worker's heartbeat; ``None`` for a storage no other process can open.
        n_trials: The study's total trials (POT's ``max_trials``); ``None`` for no limit.
        timeout: Seconds after which no trial starts (POT's ``max_minutes * 60``).
        callbacks: Optuna ``optimize`` callbacks, called after each trial (``study.stop()`` in a
            callback does not end this loop).
        show_progress_bar: Show trial k of N, the best result so far and the time left.
    """

    def __init__(
        self,
        study: optuna.Study,
        storage: optuna.storages.BaseStorage,
        objective: QuantizationObjective,
        lock: StudyLock,
        heartbeat: Heartbeat | None,
        n_trials: int | None,
        timeout: float | None = None,
        callbacks: Sequence[Callable[[optuna.Study, FrozenTrial], None]] = (),
        show_progress_bar: bool = False,
    ) -> None:
        self.study = study
        self.storage = storage
        self.objective = objective
        self.lock = lock
        self.heartbeat = heartbeat
        self.n_trials = n_trials
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.callbacks = list(callbacks)
        self.bar = tqdm(total=n_trials, disable=not show_progress_bar, unit="trial")
        self.waiter = Waiter(heartbeat)
        self.reference_stored = False
        self.guidance_settled = not objective.settings.guided

    def run(self) -> None:
        """Run trials until the study needs no more from this worker.

        Raises:
            ReferenceMeasurementError: If the reference cannot be measured.
            KeyboardInterrupt: Re-raised once the interrupted trial is failed and queued again.
        """
        if records.reference_scaling(self.study) is None:
            check_baseline(self.objective.measurer)  # before any trial: a failing eval_fn leaves none
        else:
            self.objective.measurer.wait_for_baseline()  # nothing may run beside the first timing
        if hasattr(self.study.sampler, "set_inactive"):
            self.study.sampler.set_inactive(self.objective.space.inactive())
        with self.bar:
            while True:
                step, trials = self.waiter.watch(self.lock, self.study, self._look)
                if step == Step.STOP:
                    return
                if step == Step.RUN and not self.guidance_settled and self._guide(trials):
                    continue  # look again: the start-up trials it queued come first
                self._take_prior()
                trial_id = self._take_trial(step, trials)
                if trial_id is not None:
                    self._run_trial(trial_id)

    def _look(self, trials: Sequence[FrozenTrial]) -> tuple[tuple[Step, Sequence[FrozenTrial]] | None, str]:
        self._show(trials)
        # Stored once for all: one read less a decision once it is.
        self.reference_stored = self.reference_stored or records.reference_scaling(self.study) is not None
        step, waiting_on = decide(
            trials,
            self.n_trials,
            reference_stored=self.reference_stored,
            past_deadline=self.deadline is not None and time.monotonic() >= self.deadline,
            stop_targets=self.objective.targets if self.objective.settings.stop_on_target else None,
        )
        return (None, waiting_on) if step == Step.WAIT else ((step, trials), "")

    def _guide(self, trials: Sequence[FrozenTrial]) -> bool:
        """Measure the sensitivity here if it is due; whether this worker measured it. Once any
        worker claimed it, this one no longer looks."""
        measured = False
        if self.reference_stored and guiding.due(self.study, trials, self.objective.settings):
            seconds_left = None if self.deadline is None else self.deadline - time.monotonic()
            measured = guiding.measure_when_claimed(
                self.study, self.objective, self.lock, trials, self.n_trials, seconds_left, self._room
            )
        self.guidance_settled = guiding.settled(self.study)
        return measured

    def _room(self) -> int | None:
        """The trials the budget has room for now, others' made since any read counted."""
        return None if self.n_trials is None else self.n_trials - counted_trials(self.study.get_trials(deepcopy=False))

    def _take_prior(self) -> None:
        """Give the sampler the study's prior as it stands: the measured one, and the choices any
        worker learnt to fail."""
        objective = self.objective
        guidance.set_prior(self.study.sampler, self.study, objective.targets, objective.space, objective.settings.guided)

    def _take_trial(self, step: Step, trials: Sequence[FrozenTrial]) -> int | None:
        """Under the study lock, the trial that ``step`` runs: the reference queued and popped for
        :attr:`Step.QUEUE_REFERENCE`, else the first queued trial of ``trials`` that is still
        queued, else a new one once the reference stored its scaling.

        ``trials`` were read and decided on before the lock, which is held for a few calls of one
        row each: the decision holds as long as the budget keeps room with every trial made since
        the read counted, which whether one trial number exists tells. Its storage id, or
        ``None`` to read and decide again.
        """
        storage, study_id = study_identity(self.study)
        room = None if self.n_trials is None else self.n_trials - counted_trials(trials)

        def made_since(count: int) -> bool:  # whether at least ``count`` trials were made since the read
            try:
                storage.get_trial_id_from_study_id_trial_number(study_id, len(trials) + count - 1)
                return True
            except KeyError:
                return False

        # A Ctrl-C inside the storage call that makes or pops the trial leaves one with no worker,
        # which the heartbeat fails after the grace period, like a dead worker's.
        with self.lock():
            if step == Step.QUEUE_REFERENCE:
                if made_since(1):  # perhaps the reference
                    return None
                records.enqueue_reference(self.study, self.objective.space.default_params())
                queued = [storage.get_trial_id_from_study_id_trial_number(study_id, len(trials))]
            else:
                queued = [trial_id(t) for t in trials if t.state == TrialState.WAITING]
            for waiting in queued:
                try:
                    if storage.set_trial_state_values(waiting, TrialState.RUNNING):
                        return waiting
                except UpdateFinishedTrialError:
                    pass
            # Before the scaling is stored only a queued trial runs: a new one, made because another
            # worker popped the queued reference since the read, would measure the reference again.
            if not self.reference_stored or (room is not None and (room < 1 or made_since(room))):
                return None
            return storage.create_new_trial(study_id)

    def _run_trial(self, trial_id: int) -> None:
        """Run the objective on the trial ``trial_id``, beating, and tell the study its result, as
        Optuna's ``optimize`` does (its log lines too); then the callbacks."""
        clear_trials_cache(self.study)  # the samplers read the trials once for this trial, as after Optuna's ask
        error: Exception | None = None
        trial: optuna.Trial | None = None

        def number() -> int:  # read only where the sampler's before_trial failed: Trial knows it
            return trial.number if trial is not None else study_identity(self.study)[0].get_trial(trial_id).number

        try:
            trial = optuna.Trial(self.study, trial_id)  # the sampler's before_trial runs here
            with self._beating(trial):
                values = self.objective.run(trial, self.n_trials)
        except KeyboardInterrupt:
            self._requeue(number())
            raise
        except optuna.TrialPruned as err:
            frozen = self._tell(number(), state=TrialState.PRUNED)
            _optuna_logger.info("Trial %d pruned. %s", frozen.number, err)
        except Exception as err:
            if _interrupted(err):
                self._requeue(number())
                raise KeyboardInterrupt from err
            error = err
            frozen = self._tell(number(), state=TrialState.FAIL)
            _optuna_logger.warning(
                "Trial %d failed with parameters: %s because of the following error: %r.",
                frozen.number, frozen.params, err, exc_info=err,
            )
        else:
            frozen = self._tell(number(), values)
            if frozen.state == TrialState.COMPLETE:
                log_completed_trial(self.study, frozen)
        for callback in self.callbacks:
            callback(self.study, frozen)
        if isinstance(error, ReferenceMeasurementError):
            raise error

    def _tell(self, number: int, values: Any = None, state: TrialState | None = None) -> FrozenTrial:
        try:
            return self.study.tell(number, values, state=state)
        except (UpdateFinishedTrialError, ValueError):  # failed meanwhile: its heartbeat went stale
            _logger.warning("Trial %d was failed as stale while it ran: its retry runs it again.", number)
            return self.study.get_trials(deepcopy=False)[number]

    def _beating(self, trial: optuna.Trial) -> AbstractContextManager[None]:
        return nullcontext() if self.heartbeat is None else self.heartbeat.beating(self.study, trial)

    def _requeue(self, number: int) -> None:
        """Fail and queue again a trial interrupted here (Ctrl-C), as the heartbeat does a dead worker's."""
        # Under the lock, as the heartbeat's retries: no worker decides between the FAIL and the retry.
        with self.lock():
            trial = self.study.get_trials(deepcopy=False)[number]
            if trial.state == TrialState.RUNNING:  # at once, rather than after its grace period
                trial = self.study.tell(number, state=TrialState.FAIL)
            if trial.state == TrialState.FAIL:
                queue_again(self.study, trial, MAX_RETRY)
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


def _interrupted(err: BaseException) -> bool:
    """Whether ``err`` was raised while a Ctrl-C was handled: a library's clean-up can replace the
    ``KeyboardInterrupt`` (Optuna's journal lock unlinks a file that its interrupted rename never made)."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__context__
    return False
