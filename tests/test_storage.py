"""Storage URLs, errors before any work, the shared budget and reference, artifacts, Pareto mode."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import onnx
import optuna
from optuna.artifacts import get_all_artifact_meta
from optuna.trial import TrialState
import pytest

from conftest import assert_int8_layers
import optuna_quant as oq
from optuna_quant.artifacts import model_filename
from optuna_quant.budget import counted_trials
from optuna_quant.budget import RESERVED_KEY
from optuna_quant.budget import reserve_trial
from optuna_quant.claims import REFERENCE_CLAIM_KEY
from optuna_quant.claims import WORKER
from optuna_quant.objective import FP32_ACCURACY_KEY
from optuna_quant.objective import SCALING_KEY
from optuna_quant.objective import WORKER_KEY
from optuna_quant.storage import DEFAULT_ARTIFACT_DIR
from optuna_quant.storage import default_artifact_dir
from optuna_quant.storage import GRACE_PERIOD
from optuna_quant.storage import HEARTBEAT_INTERVAL
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


@pytest.mark.postgres
def test_heartbeat_on_a_database_server(postgres_url) -> None:
    storage = open_storage(postgres_url)
    assert heartbeat_interval(storage) == HEARTBEAT_INTERVAL
    assert storage.grace_period == GRACE_PERIOD
    assert heartbeat_interval(open_storage(postgres_url, heartbeat_interval=3)) == 3
    assert sqlite_file(storage) is None
    assert default_artifact_dir(storage) == Path(DEFAULT_ARTIFACT_DIR)  # no file to put them beside


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
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage)
    shared_lock = study_lock(storage, study.study_name)
    study.set_user_attr(REFERENCE_CLAIM_KEY, {"worker": "elsewhere:1", "beat": 0})
    calls = []

    def counting(session):
        calls.append(1)
        return agreement(session)

    waiter = oq.QuantizationObjective(
        cnn_path, calib, counting, benchmark=fast_bench, lock=shared_lock, wait_timeout=0.5
    )
    with pytest.raises(TimeoutError, match="reference trial of worker elsewhere:1"):
        waiter.prepare(study)
    # The waiter never took the other worker's claim over.
    assert study.user_attrs[REFERENCE_CLAIM_KEY]["worker"] == "elsewhere:1"
    assert calls == [] and study.trials == []

    # That worker gives its claim up, as a failed measurement does; a real first worker (a thread
    # here) claims the reference and measures it, its first evaluation held until the waiter
    # has seen the claim and polled again.
    polls = []
    polled_twice = threading.Event()

    def watched_lock():
        polls.append(1)
        if len(polls) == 2:
            polled_twice.set()
        return shared_lock()

    claimed = threading.Event()

    def held_first(session):
        if not claimed.is_set():
            claimed.set()
            polled_twice.wait(timeout=30)
        return agreement(session)

    worker = oq.QuantizationObjective(cnn_path, calib, held_first, benchmark=fast_bench, lock=shared_lock)
    errors = []

    def run_worker() -> None:
        try:
            worker.prepare(study)
        except BaseException as err:  # re-raised by the assertions below
            errors.append(err)

    study.set_user_attr(REFERENCE_CLAIM_KEY, None)
    thread = threading.Thread(target=run_worker)
    thread.start()
    assert claimed.wait(timeout=30), errors
    assert study.user_attrs[REFERENCE_CLAIM_KEY]["worker"] == WORKER and SCALING_KEY not in study.user_attrs
    waiter.lock = watched_lock
    waiter.wait_timeout = 30
    waiter.prepare(study)
    thread.join(timeout=60)
    assert not thread.is_alive() and errors == []
    assert polled_twice.is_set()  # the waiter saw the claim and waited
    assert waiter.scaling is not None and worker.scaling is not None
    # It took the scaling and fp32 score that the other worker measured and stored.
    assert waiter.scaling == worker.scaling
    assert waiter.scaling.to_dict() == study.user_attrs[SCALING_KEY]
    assert waiter.fp32_accuracy == worker.fp32_accuracy == study.user_attrs[FP32_ACCURACY_KEY]
    assert calls == []  # it measured nothing: the other worker did
    (reference,) = study.trials
    assert reference.user_attrs["reference"] is True and reference.user_attrs[WORKER_KEY] == WORKER


def test_failed_reference_releases_its_claim_for_a_retry(cnn_path, calib, agreement, fast_bench) -> None:
    study = optuna.create_study()
    calls = []

    def fails_first(session):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("dataset shard unreadable")
        return agreement(session)

    objective = oq.QuantizationObjective(cnn_path, calib, fails_first, benchmark=fast_bench, wait_timeout=0.5)
    with pytest.raises(RuntimeError, match="dataset shard unreadable"):
        objective.prepare(study)
    assert study.user_attrs[REFERENCE_CLAIM_KEY] is None  # released: no wait for it to turn stale
    objective.prepare(study)  # the retry of the same process measures the reference at once
    assert objective.scaling is not None
    assert [t.user_attrs.get("reference") for t in study.trials] == [True]


def test_a_claim_of_this_process_is_waited_for_not_taken_over(cnn_path, calib, agreement, fast_bench) -> None:
    # Another thread of this process measures the reference: a second thread must not measure it too.
    study = optuna.create_study()
    study.set_user_attr(REFERENCE_CLAIM_KEY, {"worker": WORKER, "beat": 0})
    objective = oq.QuantizationObjective(cnn_path, calib, agreement, benchmark=fast_bench, wait_timeout=0.5)
    with pytest.raises(TimeoutError, match="reference trial of worker"):
        objective.prepare(study)
    assert study.trials == []


def test_best_model_is_an_artifact_and_loss_is_named(tmp_path, make_study) -> None:
    study = make_study(accuracy_loss=50.0)
    best = study.optimize(n_trials=3)
    assert study.study.metric_names == ["loss"]
    files = [meta.filename for meta in get_all_artifact_meta(study.study)]
    assert files == [model_filename(best.number)]
    study.export_best(tmp_path / "best.onnx")  # the same model: not stored twice
    assert len(get_all_artifact_meta(study.study)) == 1
    assert len(list((tmp_path / "study-artifacts").iterdir())) == 1
    # The exported file is the stored artifact, and the int8 model of the best trial.
    (stored,) = (tmp_path / "study-artifacts").iterdir()
    assert (tmp_path / "best.onnx").read_bytes() == stored.read_bytes()
    assert_int8_layers(onnx.load(str(tmp_path / "best.onnx")), best.params)


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
