"""The one place that reaches into Optuna's private API, each use with its reason.

- ``Trial._trial_id``: the storage id of a running trial, which the public
  ``RDBStorage.record_heartbeat`` takes and no public accessor gives. Optuna never fails a running
  trial that has no heartbeat yet, and its heartbeat thread writes the first one alongside the
  objective (later still while SQLite's write lock is busy): a worker killed in the first moments of
  a trial would leave it running for ever, holding its place in the budget and every worker that
  waits on it. The worker loop writes that first heartbeat itself, before the trial can be seen
  as its own (:func:`record_first_heartbeat`).
- ``Study._storage``, ``Study._study_id`` and the RDB storage's ``TrialModel`` and session: which
  running trials have no heartbeat at all, which the public API does not say. A worker killed
  after Optuna's ask created its trial but before that first heartbeat (the sampler's
  ``before_trial`` runs in between) leaves a trial Optuna never fails; :func:`optuna_quant.storages.waiting.fail_stale_trials`
  fails it (:func:`fail_never_beaten`).
- ``HeartbeatThread._record_heartbeat`` and the stop event among its thread's ``_args``: a Ctrl-C
  inside Optuna's ``with get_heartbeat_thread(...)`` entry starts the non-daemon heartbeat thread
  and skips the exit that stops it, so the process never ends after that Ctrl-C (and the trial's
  heartbeat never stops). The worker stops such a thread after the interrupt
  (:func:`stop_orphan_heartbeats`).
"""

from __future__ import annotations

import copy
import datetime
import threading

import optuna
from optuna.storages import BaseStorage
from optuna.storages._heartbeat import HeartbeatThread
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.storages import RDBStorage
from optuna.trial import TrialState
import sqlalchemy.orm


def record_first_heartbeat(storage: BaseStorage, trial: optuna.Trial) -> None:
    """Write ``trial``'s heartbeat now, where ``storage`` runs a heartbeat."""
    if isinstance(storage, RDBStorage) and storage.get_heartbeat_interval() is not None:
        storage.record_heartbeat(trial._trial_id)


def stop_orphan_heartbeats() -> int:
    """Stop every Optuna heartbeat thread still running in this process; how many were stopped.

    Call it only where no trial of this process is running: any such thread is then an orphan.
    """
    orphans = [t for t in threading.enumerate() if getattr(t, "_target", None) is HeartbeatThread._record_heartbeat]
    for thread in orphans:
        thread._args[2].set()  # type: ignore[attr-defined]  # (trial_id, heartbeat, stop_event)
        thread.join()
    return len(orphans)


def study_storage(study: optuna.Study) -> BaseStorage:
    """The storage ``study`` was opened on: an RDB storage without the cache Optuna wraps it in."""
    return getattr(study._storage, "_backend", study._storage)


def fail_never_beaten(study: optuna.Study, started_before: datetime.datetime) -> None:
    """Fail ``study``'s running trials that have no heartbeat and started before ``started_before``,
    as Optuna fails a stale trial: then its storage's stale-trial callback (the retry) runs.

    Nothing where the storage runs no heartbeat.
    """
    rdb = study_storage(study)
    if not isinstance(rdb, RDBStorage) or rdb.get_heartbeat_interval() is None:
        return
    with _create_scoped_session(rdb.scoped_session) as session:
        running = (
            session.query(models.TrialModel)
            .options(sqlalchemy.orm.selectinload(models.TrialModel.heartbeats))
            .filter(models.TrialModel.state == TrialState.RUNNING, models.TrialModel.study_id == study._study_id)
            .all()
        )
        never_beaten = [
            trial.trial_id
            for trial in running
            if not trial.heartbeats and (trial.datetime_start is None or trial.datetime_start < started_before)
        ]
    # Through the study's own storage, whose cache must see the change.
    storage = study._storage
    callback = rdb.get_heartbeat_stale_trial_callback()
    for trial_id in never_beaten:
        try:
            if not storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker failed it first
        if callback is not None:
            callback(study, copy.deepcopy(storage.get_trial(trial_id)))
