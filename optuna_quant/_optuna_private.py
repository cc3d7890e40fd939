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
- ``Study._storage`` and ``_CachedStorage._backend``: the RDB storage behind the cache Optuna
  wraps it in for a study. The cache says neither that a study's storage is an RDB one nor its
  heartbeat grace period, which bounds how long a worker waits for another
  (:func:`storage_backend`, :func:`study_storage`).
- ``Study._get_trials(use_cache=True)``: the trials as Optuna read them once for the trial being
  asked for, which Optuna's own samplers read (:func:`cached_trials`). The public ``get_trials``
  reads the storage again: once per parameter for an independent suggestion, a query each on an
  RDB storage, and each time with what other workers wrote since.
- ``Study._storage`` and ``Study._study_id``: which study a sampler's caches hold, across the
  ``Study`` objects opened on it; a name does not tell, as a deleted study's name can come back
  with other trials (:func:`study_identity`).
- ``Trial._trial_id`` of a ``FrozenTrial`` and ``Study._storage``: a sampler's claim on a
  configuration is a system attribute of the trial being sampled, written before the trial has
  parameters (:mod:`optuna_quant.samplers._coordination`). Optuna 5 has no public way to write a
  trial's system attribute; its own CMA-ES sampler writes its state this way
  (:func:`set_trial_system_attr`).
- The ``"fixed_params"`` system attribute: the parameters ``Study.enqueue_trial`` gives a trial
  that has not started, which no public accessor returns. The samplers exclude them from what
  other trials may choose (:func:`fixed_params`).
- The loggers of Optuna's lines of a finished trial (``optuna.study.study``) and of a failed one
  (``optuna.study._optimize``) and those lines' form, which lists every parameter: on a model of
  48 layers, 53 of them. :func:`optuna_quant.logs.compact_trial_lines` sums the layers up in them
  (:data:`TRIAL_LINE_LOGGERS`).
"""

from __future__ import annotations

import copy
import datetime
import threading
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.storages import RDBStorage
from optuna.storages._heartbeat import HeartbeatThread
from optuna.trial import FrozenTrial
from optuna.trial import TrialState


# Study.enqueue_trial's key (optuna.study.Study.enqueue_trial, read by optuna.trial.Trial).
_FIXED_PARAMS_KEY = "fixed_params"
TRIAL_LINE_LOGGERS = ("optuna.study.study", "optuna.study._optimize")
"""The loggers of "Trial N finished with value: ... and parameters: {...}" (``Study._log_completed_trial``)
and of "Trial N failed with parameters: {...} because of ..." (``_optimize._log_failed_trial``)."""


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


def storage_backend(storage: BaseStorage) -> BaseStorage:
    """``storage`` without the cache Optuna wraps an RDB storage in for a study."""
    return getattr(storage, "_backend", storage)


def study_storage(study: optuna.Study) -> BaseStorage:
    """The storage ``study`` was opened on: an RDB storage without the cache Optuna wraps it in."""
    return storage_backend(study._storage)


def cached_trials(study: optuna.Study) -> list[FrozenTrial]:
    """``study``'s trials as Optuna read them for the trial being asked for; not to be modified."""
    return study._get_trials(deepcopy=False, use_cache=True)


def study_identity(study: optuna.Study) -> tuple[BaseStorage, int]:
    """The storage ``study`` holds (with Optuna's cache, if any) and the study's id in it."""
    return study._storage, study._study_id


def set_trial_system_attr(study: optuna.Study, trial: FrozenTrial, key: str, value: Any) -> None:
    """Write the system attribute ``key`` of ``study``'s ``trial``, which may be running."""
    study._storage.set_trial_system_attr(trial._trial_id, key, value)


def fixed_params(trial: FrozenTrial) -> dict[str, Any] | None:
    """The parameters ``Study.enqueue_trial`` gave ``trial``; ``None`` when it gave none."""
    return trial.system_attrs.get(_FIXED_PARAMS_KEY)


def fail_never_beaten(study: optuna.Study, started_before: datetime.datetime) -> None:
    """Fail ``study``'s running trials that have no heartbeat and started before ``started_before``,
    as Optuna fails a stale trial: then its storage's stale-trial callback (the retry) runs.

    Nothing where the storage runs no heartbeat.
    """
    # Here, not above: the samplers import this module, and need no SQLAlchemy.
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session
    import sqlalchemy.orm

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
