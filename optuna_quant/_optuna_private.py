"""The one place that reaches into Optuna's private API, each use with its reason.

- ``Trial._trial_id``: the storage id of a running trial, which the public
  ``RDBStorage.record_heartbeat`` takes and no public accessor gives. Optuna never fails a running
  trial that has no heartbeat yet, and its heartbeat thread writes the first one alongside the
  objective (later still while SQLite's write lock is busy): a worker killed in the first moments of
  a trial would leave it running for ever, holding its place in the budget and every worker that
  waits on it. The worker loop writes that first heartbeat itself, before the trial can be seen
  as its own (:func:`record_first_heartbeat`).
"""

from __future__ import annotations

import optuna
from optuna.storages import BaseStorage
from optuna.storages import RDBStorage


def record_first_heartbeat(storage: BaseStorage, trial: optuna.Trial) -> None:
    """Write ``trial``'s heartbeat now, where ``storage`` runs a heartbeat."""
    if isinstance(storage, RDBStorage) and storage.get_heartbeat_interval() is not None:
        storage.record_heartbeat(trial._trial_id)
