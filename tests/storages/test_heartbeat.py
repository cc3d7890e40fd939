"""The heartbeat kept in the trials: beats while a trial runs, stale once silent for the grace
period on the watcher's own clock (a trial that never beat too), failed and queued again once."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState
import pytest

from optuna_quant._optuna_private import set_trial_system_attr
from optuna_quant.storages import heartbeat as heartbeat_module
from optuna_quant.storages.heartbeat import Heartbeat
from optuna_quant.storages.heartbeat import HEARTBEAT_KEY
from optuna_quant.storages.heartbeat import STALE_KEY


class Clock:
    """A monotonic clock that moves when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(heartbeat_module.time, "monotonic", clock)
    return clock


def test_a_running_trial_beats_at_once_and_until_it_ends() -> None:
    study = optuna.create_study()
    trial = study.ask()
    with Heartbeat(interval=0.01, grace=1).beating(study, trial):
        first = study.trials[0].system_attrs[HEARTBEAT_KEY]  # written before the block began
        while study.trials[0].system_attrs[HEARTBEAT_KEY] == first:
            pass  # the next beat, an interval later
    last = study.trials[0].system_attrs[HEARTBEAT_KEY]
    study.tell(trial, 1.0)
    assert study.trials[0].system_attrs[HEARTBEAT_KEY] == last  # no beat after the block


def test_a_trial_is_stale_once_its_heartbeat_stayed_unchanged_for_the_grace_period(clock: Clock) -> None:
    study = optuna.create_study()
    beating, silent, never_beat = study.ask(), study.ask(), study.ask()
    heartbeat = Heartbeat(interval=1, grace=3)
    for trial, value in ((beating, 1), (silent, 1)):
        set_trial_system_attr(study, trial, HEARTBEAT_KEY, value)
    assert heartbeat.stale(study.trials) == []  # first seen now
    clock.now += 2
    set_trial_system_attr(study, beating, HEARTBEAT_KEY, 2)
    assert heartbeat.stale(study.trials) == []
    clock.now += 1.5  # 3.5 s since silent and never_beat were first seen, 1.5 s since beating's beat
    assert [t.number for t in heartbeat.stale(study.trials)] == [silent.number, never_beat.number]


def test_a_worker_that_starts_watching_late_waits_a_whole_grace_period(clock: Clock) -> None:
    # No clock of another machine is read: a trial that went silent long ago counts from now.
    study = optuna.create_study()
    study.ask()
    late = Heartbeat(interval=1, grace=3)
    assert late.stale(study.trials) == []
    clock.now += 2.9
    assert late.stale(study.trials) == []
    clock.now += 0.2
    assert len(late.stale(study.trials)) == 1


def test_a_stale_trial_is_failed_and_queued_again_once(clock: Clock) -> None:
    study = optuna.create_study()
    trial = study.ask()
    trial.suggest_int("x", 0, 9)
    heartbeat, other_worker = Heartbeat(interval=1, grace=3), Heartbeat(interval=1, grace=3)
    heartbeat.stale(study.trials), other_worker.stale(study.trials)
    clock.now += 4
    stale = heartbeat.stale(study.trials)
    assert other_worker.fail(study, other_worker.stale(study.trials)) == [trial.number]
    assert heartbeat.fail(study, stale) == []  # already failed by the other worker
    failed, retry = study.trials
    assert failed.state == TrialState.FAIL and retry.state == TrialState.WAITING
    assert retry.params == failed.params and retry.system_attrs["failed_trial"] == failed.number


def test_a_trial_failed_as_stale_whose_retry_was_never_queued_is_queued(clock: Clock) -> None:
    # As after a worker killed between failing a stale trial and queueing its retry.
    study = optuna.create_study()
    trial = study.ask()
    set_trial_system_attr(study, trial, STALE_KEY, trial.number)
    study.tell(trial, state=TrialState.FAIL)
    errored = study.ask()  # failed by its objective's error: not queued again
    study.tell(errored, state=TrialState.FAIL)
    heartbeat = Heartbeat(interval=1, grace=3)
    assert [t.number for t in heartbeat.stale(study.trials)] == [trial.number]
    assert heartbeat.fail(study, heartbeat.stale(study.trials)) == [trial.number]
    assert heartbeat.stale(study.trials) == []  # its retry, which names it, carries its mark
    assert study.trials[-1].state == TrialState.WAITING and study.trials[-1].system_attrs["failed_trial"] == trial.number


def test_the_grace_period_must_exceed_the_interval() -> None:
    with pytest.raises(ValueError, match="heartbeat_interval < grace_period"):
        Heartbeat(interval=10, grace=10)
