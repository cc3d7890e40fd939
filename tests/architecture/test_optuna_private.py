"""Each function of ``optuna_quant/_optuna_private.py`` on real studies, so that an Optuna release
that removes or changes a private attribute it relies on fails here, by that attribute's name.

Each study is tried on an in-memory storage and on an SQLite RDB storage, which a study holds
behind Optuna's cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
import datetime
import logging
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.storages import InMemoryStorage
from optuna.storages import RDBStorage
from optuna.trial import TrialState
import pytest


try:
    from optuna_quant import _optuna_private as private
except ImportError as error:  # Optuna moved or removed a private module or name
    pytest.fail(
        f"optuna_quant/_optuna_private.py cannot import {error.name or error} from Optuna "
        f"{optuna.__version__}: {error}",
        pytrace=False,
    )


@contextmanager
def relied_on(attribute: str) -> Iterator[None]:
    """Fail with ``attribute`` named where Optuna no longer has it as ``_optuna_private`` uses it."""
    try:
        yield
    except (AttributeError, ImportError, KeyError, TypeError) as error:
        pytest.fail(
            f"Optuna {optuna.__version__} changed {attribute}, which optuna_quant/_optuna_private.py "
            f"relies on: {error!r}",
            pytrace=False,
        )


def _rdb(tmp_path: Path, heartbeat: bool = False, **kwargs: Any) -> RDBStorage:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    if not heartbeat:
        return RDBStorage(url)
    with pytest.warns(optuna.exceptions.ExperimentalWarning):
        return RDBStorage(url, heartbeat_interval=60, grace_period=120, **kwargs)


@pytest.fixture(params=["in-memory", "sqlite"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> BaseStorage:
    return InMemoryStorage() if request.param == "in-memory" else _rdb(tmp_path)


def test_storage_backend_is_the_storage_behind_the_cache(storage: BaseStorage) -> None:
    study = optuna.create_study(storage=storage)
    with relied_on("Study._storage and _CachedStorage._backend"):
        assert private.study_storage(study) is storage, "Study._storage or _CachedStorage._backend"
        assert private.storage_backend(storage) is storage


def test_study_identity_is_the_storage_and_the_study_id(storage: BaseStorage) -> None:
    optuna.create_study(storage=storage, study_name="first")
    study = optuna.create_study(storage=storage, study_name="second")
    with relied_on("Study._storage and Study._study_id"):
        held, study_id = private.study_identity(study)
        assert held.get_study_name_from_id(study_id) == "second", "Study._study_id"
        assert private.storage_backend(held) is storage, "Study._storage"


def test_cached_trials_are_read_once_per_ask(storage: BaseStorage) -> None:
    study = optuna.create_study(storage=storage, sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: t.suggest_int("x", 0, 3), n_trials=2)
    with relied_on("Study._get_trials(deepcopy=False, use_cache=True)"):
        trials = private.cached_trials(study)
        assert [t.number for t in trials] == [0, 1]
        assert private.cached_trials(study) is trials, "Study._get_trials no longer caches with use_cache=True"
        study.ask()  # a new ask reads again
        assert len(private.cached_trials(study)) == 3, "Study.ask no longer clears the trials' cache"


def test_a_system_attr_of_a_running_trial_is_written(storage: BaseStorage) -> None:
    study = optuna.create_study(storage=storage)
    study.ask()
    (running,) = study.get_trials(deepcopy=False)
    with relied_on("Study._storage and FrozenTrial._trial_id"):
        private.set_trial_system_attr(study, running, "optuna_quant:test", [1, 2])
    assert study.get_trials()[0].system_attrs["optuna_quant:test"] == [1, 2]


def test_fixed_params_are_enqueue_trials(storage: BaseStorage) -> None:
    study = optuna.create_study(storage=storage)
    study.enqueue_trial({"x": 2})
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=0.0))
    waiting, added = study.get_trials(deepcopy=False)
    with relied_on("the 'fixed_params' system attribute of Study.enqueue_trial"):
        assert private.fixed_params(waiting) == {"x": 2}, "enqueue_trial's 'fixed_params' system attribute"
        assert private.fixed_params(added) is None


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_the_first_heartbeat_spares_a_trial_that_never_beat_from_failing(tmp_path: Path) -> None:
    failed = []
    storage = _rdb(tmp_path, heartbeat=True, heartbeat_stale_trial_callback=lambda s, t: failed.append(t.number))
    study = optuna.create_study(storage=storage)
    beaten, silent = study.ask(), study.ask()
    with relied_on("Trial._trial_id"):
        private.record_first_heartbeat(storage, beaten)
    later = datetime.datetime.now() + datetime.timedelta(seconds=1)
    with relied_on("the RDB storage's TrialModel, its heartbeats, and _create_scoped_session"):
        private.fail_never_beaten(study, started_before=later)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states == [TrialState.RUNNING, TrialState.FAIL], "a trial's first heartbeat, or TrialModel.heartbeats"
    assert failed == [silent.number], "the storage's stale-trial callback"


def test_without_heartbeat_nothing_is_failed(storage: BaseStorage) -> None:
    study = optuna.create_study(storage=storage)
    trial = study.ask()
    private.record_first_heartbeat(storage, trial)
    private.fail_never_beaten(study, started_before=datetime.datetime.now() + datetime.timedelta(seconds=1))
    assert study.get_trials()[0].state == TrialState.RUNNING


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_an_orphan_heartbeat_thread_is_found_and_stopped(tmp_path: Path) -> None:
    storage = _rdb(tmp_path, heartbeat=True)
    study = optuna.create_study(storage=storage)
    trial = study.ask()
    thread = optuna.storages._heartbeat.get_heartbeat_thread(trial._trial_id, storage)
    thread.start()
    with relied_on("HeartbeatThread._record_heartbeat and the stop event among its thread's _args"):
        assert private.stop_orphan_heartbeats() == 1, "HeartbeatThread._record_heartbeat as the thread's target"
    assert private.stop_orphan_heartbeats() == 0, "the stop event among the heartbeat thread's _args"


def test_the_lines_per_trial_come_from_their_loggers_and_are_summed_up(caplog) -> None:
    from optuna_quant import logs

    logs.compact_trial_lines(map(logging.getLogger, private.TRIAL_LINE_LOGGERS), "layer:")
    params = {f"layer:node_MatMul_{i}": "fp32" if i in (3, 7) else "int8" for i in range(48)}

    def objective(trial: optuna.Trial) -> float:
        fp32 = sum(trial.suggest_categorical(name, [value]) == "fp32" for name, value in params.items())
        if trial.number == 1:
            raise ValueError("supplied range of {-inf, inf} is not finite")  # braces in the reason too
        return fp32

    study = optuna.create_study()
    with caplog.at_level(logging.INFO, logger="optuna"):
        study.optimize(objective, n_trials=2, catch=(ValueError,))
    lines = [r.getMessage() for r in caplog.records if r.name in private.TRIAL_LINE_LOGGERS]
    summed = "{'layer': '48 layers: 46 int8, 2 fp32 (node_MatMul_3, node_MatMul_7)'}"
    # Optuna's forms: another one would come through unchanged, 48 parameters long.
    assert f"Trial 0 finished with value: 2.0 and parameters: {summed}. Best is trial 0 with value: 2.0." in lines
    assert (
        f"Trial 1 failed with parameters: {summed} because of the following error: "
        "ValueError('supplied range of {-inf, inf} is not finite')."
    ) in lines
