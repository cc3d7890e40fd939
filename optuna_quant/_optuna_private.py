"""The one place that reaches into Optuna's private API, each use with its reason.

- ``Trial._trial_id``: the storage id of a running trial, which the public
  ``RDBStorage.record_heartbeat`` takes and no public accessor gives. Optuna never fails a running
  trial that has no heartbeat yet, and its heartbeat thread writes the first one alongside the
  objective (later still while SQLite's write lock is busy): a worker killed in the first moments of
  a trial would leave it running for ever, holding its place in the budget and every worker that
  waits on it. The worker loop writes that first heartbeat itself, before the trial can be seen
  as its own (:func:`record_first_heartbeat`).
- ``HeartbeatThread._record_heartbeat`` and the stop event among its thread's ``_args``: a Ctrl-C
  inside Optuna's ``with get_heartbeat_thread(...)`` entry starts the non-daemon heartbeat thread
  and skips the exit that stops it, so the process never ends after that Ctrl-C (and the trial's
  heartbeat never stops). The worker stops such a thread after the interrupt
  (:func:`stop_orphan_heartbeats`).
"""

from __future__ import annotations

import threading

import optuna
from optuna.storages import BaseStorage
from optuna.storages._heartbeat import HeartbeatThread
from optuna.storages import RDBStorage


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
