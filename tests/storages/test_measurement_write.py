"""A trial's measurement is written as Optuna writes each attribute, in one transaction where the
storage is a database: on every storage that workers share, against the real servers."""

from __future__ import annotations

import optuna
from optuna.storages import RDBStorage
import sqlalchemy

from optuna_quant._optuna_private import storage_backend
from optuna_quant.storages.factory import open_storage
from optuna_quant.trial import records


def test_a_measurement_is_one_write_that_reads_back_as_optunas(shared_url: str) -> None:
    storage = open_storage(shared_url)
    study = optuna.create_study(storage=storage, study_name="written")
    by_optuna, ours = study.ask(), study.ask()
    measured = {"acc_loss": 0.0125, "lat_diff": 1.5, "quantized": True, "note": "é @ ' \" %"}
    for key, value in {**measured, "acc_loss": 0.5}.items():
        by_optuna.set_user_attr(key, value)
    by_optuna.set_constraint("accuracy", -0.5)
    by_optuna.set_constraint("latency", 0.25)
    records.record_result(ours, {"acc_loss": 0.9}, {})  # a value written again is replaced
    backend = storage_backend(storage)
    commits: list[object] = []
    if isinstance(backend, RDBStorage):
        sqlalchemy.event.listen(backend.engine, "commit", commits.append)
    records.record_result(ours, {**measured, "acc_loss": 0.5}, {"accuracy": -0.5, "latency": 0.25})
    if isinstance(backend, RDBStorage):
        assert len(commits) == 1
    expected, written = optuna.load_study(study_name="written", storage=storage).get_trials()
    assert written.user_attrs == expected.user_attrs
    assert written.system_attrs == expected.system_attrs
