"""The worker's decision (:func:`optuna_quant.study.worker.decide`) rule by rule, its budget count,
and the trial it then takes under the study lock."""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import TrialState
import pytest

from optuna_quant.measure.loss import Targets
from optuna_quant.study import guiding
from optuna_quant.study.worker import counted_trials
from optuna_quant.study.worker import decide
from optuna_quant.study.worker import Step
from optuna_quant.study.worker import Worker
from optuna_quant.trial import records
from optuna_quant.trial.objective import TrialSettings
from optuna_quant.trial.records import REFERENCE_KEY


TARGETS = Targets(accuracy_loss=1.0, latency_reduce=1.5)
MET = {"acc_loss": 0.001, "lat_diff": 2.0}
MISSED = {"acc_loss": 0.02, "lat_diff": 2.0}
RUN = (Step.RUN, "")
STOP = (Step.STOP, "")


def _trials(*states: TrialState | tuple[TrialState, dict]) -> list[FrozenTrial]:
    """Trials numbered from 0: a state, or a state and the trial's user attrs."""
    trials = []
    for number, item in enumerate(states):
        state, attrs = item if isinstance(item, tuple) else (item, {})
        value = 0.0 if state == TrialState.COMPLETE else None
        trial = optuna.trial.create_trial(state=state, value=value, user_attrs={**MISSED, **attrs})
        trial.number = number
        trials.append(trial)
    return trials


def test_the_deadline_stops_whatever_is_left() -> None:
    trials = _trials(TrialState.COMPLETE, TrialState.WAITING)
    assert decide(trials, 10, reference_stored=True, past_deadline=True) == STOP
    assert decide(trials, 10, reference_stored=True) == RUN


def test_past_the_deadline_the_reference_still_runs_unless_another_worker_runs_it() -> None:
    # A study ends with a model, never with nothing: its reference is one.
    assert decide([], 10, reference_stored=False, past_deadline=True)[0] == Step.QUEUE_REFERENCE
    queued = _trials((TrialState.WAITING, {REFERENCE_KEY: True}))
    assert decide(queued, 10, reference_stored=False, past_deadline=True) == RUN
    running = _trials((TrialState.RUNNING, {REFERENCE_KEY: True}))
    assert decide(running, 10, reference_stored=False, past_deadline=True) == STOP
    assert decide(running, 10, reference_stored=False)[0] == Step.WAIT


def test_stop_on_target_stops_once_a_trial_other_than_the_reference_met_both() -> None:
    reference_met = _trials((TrialState.COMPLETE, {**MET, REFERENCE_KEY: True}), TrialState.COMPLETE)
    assert decide(reference_met, 10, reference_stored=True, stop_targets=TARGETS) == RUN
    met = _trials((TrialState.COMPLETE, {REFERENCE_KEY: True}), (TrialState.COMPLETE, MET))
    assert decide(met, 10, reference_stored=True, stop_targets=TARGETS) == STOP
    assert decide(met, 10, reference_stored=True) == RUN  # without stop_on_target the run goes on


def test_before_the_reference_a_running_reference_is_waited_on() -> None:
    trials = _trials(TrialState.COMPLETE, (TrialState.RUNNING, {REFERENCE_KEY: True}), TrialState.WAITING)
    assert decide(trials, 10, reference_stored=False) == (Step.WAIT, "the reference trial 1")
    # Stored meanwhile: the queued trial runs.
    assert decide(trials, 10, reference_stored=True) == RUN


@pytest.mark.parametrize(
    "queued",
    [{REFERENCE_KEY: True}, {}],
    ids=["the-reference", "a-trial-the-user-queued"],
)
def test_before_the_reference_a_queued_trial_is_popped_even_without_room(queued: dict) -> None:
    trials = _trials(TrialState.FAIL, (TrialState.WAITING, queued))
    assert decide(trials, 2, reference_stored=False) == RUN
    assert decide(trials[:1], 1, reference_stored=False) == STOP  # nothing queued, no room


def test_a_missing_reference_is_queued_while_the_budget_has_room() -> None:
    failed = _trials(TrialState.FAIL)  # a reference whose eval_fn raised: it counts
    assert decide(failed, 2, reference_stored=False) == (Step.QUEUE_REFERENCE, "")
    assert decide(failed, None, reference_stored=False) == (Step.QUEUE_REFERENCE, "")
    assert decide(failed, 1, reference_stored=False) == STOP
    # Other workers' running trials are no reference to wait on.
    assert decide(_trials(TrialState.RUNNING), 1, reference_stored=False) == STOP


def test_a_queued_trial_runs_without_room_and_a_new_one_only_with_room() -> None:
    queued = _trials(TrialState.COMPLETE, TrialState.COMPLETE, TrialState.WAITING)
    assert decide(queued, 3, reference_stored=True) == RUN  # the queued trial counts: no room, but it runs
    assert decide(queued[:2], 3, reference_stored=True) == RUN
    assert decide(queued[:2], 2, reference_stored=True) == STOP
    assert decide(queued[:2], None, reference_stored=True) == RUN


def test_a_retried_trial_uses_the_budget_once() -> None:
    trials = _trials(TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE)
    trials[2] = optuna.trial.create_trial(value=0.0, user_attrs=MISSED, system_attrs={"retry_history": [1]})
    trials[2].number = 2
    assert counted_trials(trials) == 2
    assert decide(trials, 3, reference_stored=True) == RUN
    assert decide(trials, 2, reference_stored=True) == STOP


def test_without_room_running_trials_of_others_are_waited_on_then_the_worker_stops() -> None:
    trials = _trials(TrialState.COMPLETE, TrialState.RUNNING, TrialState.PRUNED, TrialState.RUNNING)
    assert decide(trials, 4, reference_stored=True) == (Step.WAIT, "running trial(s) [1, 3] of other workers")
    finished = _trials(TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED, TrialState.COMPLETE)
    assert decide(finished, 4, reference_stored=True) == STOP


def test_budget_counts_running_and_queued_trials_and_a_retried_trial_once() -> None:
    study = optuna.create_study()
    study.add_trial(optuna.trial.create_trial(value=1.0))
    study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL))  # its worker died: retried below
    study.add_trial(optuna.trial.create_trial(state=TrialState.WAITING, system_attrs={"retry_history": [1]}))
    assert counted_trials(study.trials) == 2
    assert study.ask().number == 2  # the retry is popped: it takes the failed trial's place
    assert counted_trials(study.trials) == 2
    study.ask()
    study.enqueue_trial({})
    assert counted_trials(study.trials) == 4  # running and queued trials count


def _worker(study, n_trials: int) -> Worker:
    return Worker(study.study, study.storage, study.objective, study.lock, study.heartbeat, n_trials)


def test_a_trial_is_made_only_while_the_budget_keeps_room_with_the_trials_made_since_the_read(make_study) -> None:
    study = make_study()
    worker = _worker(study, n_trials=3)
    worker.reference_stored = True
    read = study.study.get_trials()  # nothing yet; then two other workers make a trial each
    study.study.ask(), study.study.ask()
    made = worker._take_trial(Step.RUN, read)  # room for 3, 2 made since: one more
    assert made is not None and len(study.study.trials) == 3
    assert worker._take_trial(Step.RUN, read) is None  # 3 made since: read again
    assert len(study.study.trials) == 3


def test_a_queued_trial_popped_since_the_read_is_not_run_twice(make_study) -> None:
    study = make_study()
    study.study.enqueue_trial({})
    read = study.study.get_trials()
    popped = _worker(study, n_trials=1)._take_trial(Step.RUN, read)
    assert popped is not None and study.study.trials[0].state == TrialState.RUNNING
    # A second worker decided on the same read: nothing queued is left, and no room.
    assert _worker(study, n_trials=1)._take_trial(Step.RUN, read) is None
    assert len(study.study.trials) == 1


def test_before_the_scaling_a_queued_reference_popped_since_the_read_makes_no_new_trial(make_study) -> None:
    # A new trial would have measured the reference a second time (MariaDB's fault-injection runs).
    study = make_study()
    records.enqueue_reference(study.study, study.objective.space.default_params())
    read = study.study.get_trials()
    assert _worker(study, n_trials=4)._take_trial(Step.RUN, read) is not None
    assert _worker(study, n_trials=4)._take_trial(Step.RUN, read) is None
    assert len(study.study.trials) == 1


def test_the_reference_is_queued_only_if_no_trial_was_made_since_the_read(make_study) -> None:
    study = make_study()
    read = study.study.get_trials()
    first = _worker(study, n_trials=4)._take_trial(Step.QUEUE_REFERENCE, read)
    assert first is not None and study.study.trials[0].user_attrs[REFERENCE_KEY]
    assert _worker(study, n_trials=4)._take_trial(Step.QUEUE_REFERENCE, read) is None  # no second one
    assert len(study.study.trials) == 1


def test_the_sensitivity_waits_for_a_read_that_holds_the_measured_reference() -> None:
    # Another worker's read from after the reference stored its scaling, before its trial recorded
    # the measurement: the sensitivity is not due there; once the read holds it, it is.
    study = optuna.create_study()
    settings = TrialSettings(guided=True)
    running = optuna.trial.create_trial(state=TrialState.RUNNING, user_attrs={REFERENCE_KEY: True})
    running.number = 0
    assert not guiding.due(study, [running], settings)
    measured = _trials((TrialState.COMPLETE, {REFERENCE_KEY: True}), TrialState.RUNNING)
    assert guiding.due(study, measured, settings)
    assert not guiding.due(study, measured, TrialSettings(guided=False))
