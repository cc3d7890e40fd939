"""Storage URLs, errors before any work, the shared budget and reference, artifacts, Pareto mode."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import optuna
from optuna.artifacts import get_all_artifact_meta
from optuna.trial import TrialState
import pytest

import optuna_quant as oq
from optuna_quant.artifacts import model_filename
from optuna_quant.budget import counted_trials
from optuna_quant.budget import RESERVED_KEY
from optuna_quant.budget import reserve_trial
from optuna_quant.claims import REFERENCE_CLAIM_KEY
from optuna_quant.objective import FP32_ACCURACY_KEY
from optuna_quant.objective import SCALING_KEY
from optuna_quant.storage import default_artifact_dir
from optuna_quant.storage import heartbeat_interval
from optuna_quant.storage import open_storage
from optuna_quant.storage import sqlite_file
from optuna_quant.storage import StorageError
from optuna_quant.storage import study_lock
from optuna_quant.testing.postgres import free_port


def test_unreachable_storage_is_named_with_its_password_masked(tmp_path, monkeypatch, calib, agreement) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"postgresql+psycopg2://quant:s3cret@127.0.0.1:{free_port()}/studies"
    # The model does not exist either: the storage is checked first, before any work.
    with pytest.raises(StorageError, match=r"127\.0\.0\.1") as err:
        oq.create_study(tmp_path / "missing.onnx", calib, agreement, storage=url)
    assert "s3cret" not in str(err.value) and "quant:***@" in str(err.value)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_malformed_url_and_missing_sqlite_folder(tmp_path) -> None:
    with pytest.raises(StorageError, match="not a database URL"):
        open_storage("no-scheme-here")
    with pytest.raises(StorageError, match="Cannot open the storage"):
        open_storage(f"sqlite:///{tmp_path}/no/such/folder/study.db")


def test_heartbeat_only_for_database_servers(tmp_path) -> None:
    assert heartbeat_interval(open_storage(f"sqlite:///{tmp_path}/s.db")) is None
    assert default_artifact_dir(open_storage(f"sqlite:///{tmp_path}/s.db")) == tmp_path / "s-artifacts"
    memory = optuna.storages.InMemoryStorage()
    assert open_storage(memory) is memory


def test_sqlite_file_of_urls_and_storages(tmp_path) -> None:
    assert sqlite_file(f"sqlite:///{tmp_path}/s.db") == tmp_path / "s.db"
    assert sqlite_file("sqlite+pysqlite:///rel/s.db?timeout=5") == Path("rel/s.db")
    assert sqlite_file(f"sqlite:///{tmp_path}/a%20b.db") == tmp_path / "a b.db"  # as SQLAlchemy opens it
    for url in ("sqlite://", "sqlite:///:memory:", "postgresql://u:p@db/optuna", "no-scheme-here"):
        assert sqlite_file(url) is None
    assert sqlite_file(open_storage(f"sqlite:///{tmp_path}/s.db")) == tmp_path / "s.db"
    assert sqlite_file(optuna.storages.InMemoryStorage()) is None
    with study_lock(open_storage(f"sqlite:///{tmp_path}/s.db"), "s")():
        assert (tmp_path / "s.db.lock").is_file()


def test_eval_of_a_missing_study_names_study_and_storage(make_study) -> None:
    with pytest.raises(ValueError, match=r"No study 'nothing-here' in sqlite:///.*study\.db"):
        make_study(study_name="nothing-here", trials_load_method="eval")


def test_budget_counts_a_retried_trial_once_and_runs_queued_trials_first() -> None:
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage)
    lock = study_lock(storage, study.study_name)
    study.add_trial(optuna.trial.create_trial(value=1.0))
    study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL))
    # The retry copies the system attrs of the trial it replaces, a fresh reservation mark included.
    failed_mark = [study.trials[1]._trial_id, time.time()]
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.WAITING,
            system_attrs={"failed_trial": 1, "retry_history": [1], RESERVED_KEY: failed_mark},
        )
    )
    assert counted_trials(study.trials, running_counts=True) == 2
    # The queued retry is reserved first, even with the budget used up; then nothing is left.
    assert reserve_trial(study, storage, n_trials=2, lock=lock)
    assert not reserve_trial(study, storage, n_trials=2, lock=lock)
    assert reserve_trial(study, storage, n_trials=3, lock=lock)
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 2


def test_second_worker_waits_for_the_reference_of_the_first(cnn_path, calib, agreement, fast_bench) -> None:
    study = optuna.create_study()
    study.set_user_attr(REFERENCE_CLAIM_KEY, {"worker": "elsewhere:1", "beat": 0})
    calls = []

    def counting(session):
        calls.append(1)
        return agreement(session)

    waiter = oq.QuantizationObjective(cnn_path, calib, counting, benchmark=fast_bench, wait_timeout=0.5)
    with pytest.raises(TimeoutError, match="reference trial of worker elsewhere:1"):
        waiter.prepare(study)

    scaling = {"acc_min": 1.0, "acc_max": 1.01, "acc_scale": 1000.0, "lat_min": -60.0, "lat_max": -55.0, "lat_scale": 2.0}

    def finish_reference() -> None:
        time.sleep(0.5)
        study.set_user_attr(FP32_ACCURACY_KEY, 1.0)
        study.set_user_attr(SCALING_KEY, scaling)

    waiter.wait_timeout = 30
    thread = threading.Thread(target=finish_reference)
    thread.start()
    waiter.prepare(study)
    thread.join()
    assert waiter.scaling is not None and waiter.scaling.acc_scale == 1000.0
    assert calls == [] and study.trials == []  # it measured nothing: the other worker did
    # The waiter never took the other worker's claim over.
    assert study.user_attrs[REFERENCE_CLAIM_KEY]["worker"] == "elsewhere:1"


def test_best_model_is_an_artifact_and_loss_is_named(tmp_path, make_study) -> None:
    study = make_study(accuracy_loss=50.0)
    best = study.optimize(n_trials=3)
    assert study.study.metric_names == ["loss"]
    files = [meta.filename for meta in get_all_artifact_meta(study.study)]
    assert files == [model_filename(best.number)]
    study.export_best(tmp_path / "best.onnx")  # the same model: not stored twice
    assert len(get_all_artifact_meta(study.study)) == 1
    assert len(list((tmp_path / "study-artifacts").iterdir())) == 1


def test_pareto_mode_returns_both_metrics_and_keeps_pots_best(tmp_path, make_study) -> None:
    study = make_study(
        accuracy_loss=50.0, latency_reduce=0.1, objective_mode="pareto", artifact_dir=tmp_path / "models",
    )
    best = study.optimize(n_trials=4)
    assert [d.name for d in study.study.directions] == ["MINIMIZE", "MAXIMIZE"]
    assert study.study.metric_names == ["acc_loss", "lat_diff"]
    for trial in study.trials:
        assert trial.values == [trial.user_attrs["acc_loss"], trial.user_attrs["lat_diff"]]
    assert best.lat_diff == max(t.user_attrs["lat_diff"] for t in study.trials)  # all within accuracy
    # Optuna's front holds feasible trials only: with targets every trial meets, it cannot be empty.
    # No trial dominates POT's best: the highest lat_diff, the lowest acc_loss among ties.
    assert best.number in {t.number for t in study.study.best_trials}
    assert (tmp_path / "models").is_dir()
    with pytest.raises(ValueError, match="'loss' mode"):
        make_study(trials_load_method="warm_start")
