"""Storage URLs and passwords, the heartbeat, errors before anything is stored, the budget count,
the reference's one error, artifacts, Pareto mode."""

from __future__ import annotations

from pathlib import Path

import onnx
import optuna
from optuna.artifacts import get_all_artifact_meta
from optuna.trial import TrialState
import pytest

from conftest import assert_int8_layers
import optuna_quant as oq
from optuna_quant._optuna_private import stop_orphan_heartbeats
from optuna_quant.storages.artifacts import model_filename
from optuna_quant.storages.artifacts import NotWritableError
from optuna_quant.trial.records import SCALING_KEY
from optuna_quant.trial.reference import ReferenceMeasurementError
from optuna_quant.storages.rdb import DEFAULT_ARTIFACT_DIR
from optuna_quant.storages.rdb import default_artifact_dir
from optuna_quant.storages.rdb import GRACE_PERIOD
from optuna_quant.storages.rdb import grace_period
from optuna_quant.storages.rdb import HEARTBEAT_INTERVAL
from optuna_quant.storages.rdb import heartbeat_interval
from optuna_quant.storages.urls import masked_url
from optuna_quant.storages.rdb import open_storage
from optuna_quant.storages.urls import sqlite_file
from optuna_quant.storages.rdb import StorageError
from optuna_quant.storages.lock import study_lock
from optuna_quant.testing.postgres import free_port
from optuna_quant.study.worker import counted_trials


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


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://quant:s3cret@db.example.com/studies",
        "quant:s3cret@db.example.com/studies",  # no scheme
        "postgresql://quant@db.example.com/studies?password=s3cret&sslmode=off",
        "postgresql://quant:s3c@ret@db.example.com/studies",  # an unescaped "@" in the password
        "mysql+pymysql://quant:s3c/r:et@db.example.com:3306/studies",
    ],
)
def test_password_is_masked_in_every_form(tmp_path, monkeypatch, calib, agreement, url) -> None:
    masked = masked_url(url)
    assert "s3c" not in masked and "***" in masked and "db.example.com" in masked
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageError) as err:  # a real attempt to open it: the error names it masked
        oq.create_study(tmp_path / "missing.onnx", calib, agreement, storage=url.replace("db.example.com", "127.0.0.1"))
    assert "s3c" not in str(err.value)


def test_heartbeat_on_every_database_sqlite_included(tmp_path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path}/s.db", heartbeat_interval=2, grace_period=5)
    assert (heartbeat_interval(storage), grace_period(storage)) == (2, 5)
    # An in-memory database has no second connection for Optuna's heartbeat thread.
    assert heartbeat_interval(open_storage("sqlite:///:memory:")) is None
    assert default_artifact_dir(open_storage(f"sqlite:///{tmp_path}/s.db")) == tmp_path / "s-artifacts"
    memory = optuna.storages.InMemoryStorage()
    assert open_storage(memory) is memory


def test_a_heartbeat_thread_whose_exit_was_skipped_is_stopped(tmp_path) -> None:
    # As after a Ctrl-C inside Optuna's heartbeat entry: started, never exited. Non-daemon, it
    # would keep the process alive, and the trial's heartbeat would never stop.
    storage = open_storage(f"sqlite:///{tmp_path}/s.db", heartbeat_interval=1, grace_period=2)
    study = optuna.create_study(storage=storage)
    trial = study.ask()
    optuna.storages._heartbeat.get_heartbeat_thread(trial._trial_id, storage).start()
    assert stop_orphan_heartbeats() == 1
    assert stop_orphan_heartbeats() == 0


@pytest.mark.postgres
def test_heartbeat_on_a_database_server(postgres_url) -> None:
    storage = open_storage(postgres_url)
    assert (heartbeat_interval(storage), grace_period(storage)) == (HEARTBEAT_INTERVAL, GRACE_PERIOD)
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


def test_eval_fn_raising_on_the_reference_is_one_clear_error(make_study, agreement) -> None:
    def broken(session):
        raise KeyError("labels")

    study = make_study(eval_fn=broken)
    with pytest.raises(ReferenceMeasurementError) as err:
        study.optimize(n_trials=3)
    message = str(err.value)
    assert "\n" not in message and "eval_fn" in message and "reference" in message and "labels" in message
    assert study.trials == []  # the fp32 model is scored before any trial
    calls = []

    def int8_broken(session):  # scores the fp32 model, then raises on the int8 reference
        calls.append(session)
        if len(calls) > 1:
            raise KeyError("labels")
        return agreement(session)

    study = make_study(eval_fn=int8_broken)
    with pytest.raises(ReferenceMeasurementError, match=r"eval_fn could not score the reference.*int8.*labels"):
        study.optimize(n_trials=3)
    (trial,) = study.trials  # nothing ran after the reference
    assert trial.state == TrialState.FAIL and "labels" in trial.user_attrs["fail_reason"]
    # Fixed, the next run measures the reference again and goes on; the failed one counts.
    fixed = make_study(trials_load_method="warm_start")
    fixed.optimize(n_trials=3)
    assert [t.state for t in fixed.trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    assert fixed.trials[1].user_attrs["reference"] is True and SCALING_KEY in fixed.user_attrs


def test_bad_input_under_cold_start_deletes_nothing(tmp_path, make_study) -> None:
    kept = make_study()
    kept.optimize(n_trials=2)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(FileNotFoundError):
        make_study(model=tmp_path / "missing.onnx")
    with pytest.raises(NotWritableError, match=r"artifact_dir: cannot write .*a-file/models: .*a-file is a file, not a folder\."):
        make_study(artifact_dir=blocker / "models")
    with pytest.raises(ValueError, match="n_trials"):
        make_study(trials_load_method="warm_start").optimize(n_trials=-5)
    assert len(optuna.load_study(study_name="optuna-quant", storage=f"sqlite:///{tmp_path}/study.db").trials) == 2


def test_export_path_is_checked_before_the_model_is_built(tmp_path, make_study, monkeypatch) -> None:
    study = make_study()
    study.optimize(n_trials=2)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    built = []
    monkeypatch.setattr(study.objective, "build", lambda params: built.append(params))
    with pytest.raises(NotWritableError, match=r"export path: cannot write .*a-file/best\.onnx: .*a-file is a file, not a folder\."):
        study.export_best(blocker / "best.onnx")
    assert built == []


def test_best_model_is_an_artifact_and_loss_is_named(tmp_path, make_study) -> None:
    study = make_study(accuracy_loss=50.0)
    best = study.optimize(n_trials=3)
    assert study.study.metric_names == ["loss"]
    files = [meta.filename for meta in get_all_artifact_meta(study.study)]
    assert files == [model_filename(best.number)]
    study.export_best(tmp_path / "out" / "best.onnx")  # the same model: not stored twice; the folder made
    assert len(get_all_artifact_meta(study.study)) == 1
    assert len(list((tmp_path / "study-artifacts").iterdir())) == 1
    # The exported file is the stored artifact, and the int8 model of the best trial.
    (stored,) = (tmp_path / "study-artifacts").iterdir()
    assert (tmp_path / "out" / "best.onnx").read_bytes() == stored.read_bytes()
    assert_int8_layers(onnx.load(str(tmp_path / "out" / "best.onnx")), best.params)


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
