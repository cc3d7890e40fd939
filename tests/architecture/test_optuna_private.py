"""Each function of ``optuna_quant/_optuna_private.py`` on real studies, so that an Optuna release
that removes or changes a private attribute it relies on fails here, by that attribute's name.

Each study is tried on an in-memory storage and on an SQLite RDB storage, which a study holds
behind Optuna's cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
import logging
from pathlib import Path

import optuna
from optuna.storages import BaseStorage
from optuna.storages import InMemoryStorage
from optuna.storages import RDBStorage
import pytest
import sqlalchemy


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


@pytest.fixture(params=["in-memory", "sqlite"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> BaseStorage:
    return InMemoryStorage() if request.param == "in-memory" else RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")


def test_storage_backend_is_the_storage_behind_the_cache(storage: BaseStorage) -> None:
    study = optuna.create_study(storage=storage)
    with relied_on("Study._storage and _CachedStorage._backend"):
        assert private.study_storage(study) is storage, "Study._storage or _CachedStorage._backend"
        assert private.storage_backend(storage) is storage


def test_a_journal_storage_is_no_cache(tmp_path: Path) -> None:
    # A journal storage has a ``_backend`` too, its log's: it is no cache to see through.
    journal = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(tmp_path / "log")))
    with relied_on("_CachedStorage"):
        assert private.study_storage(optuna.create_study(storage=journal)) is journal


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
    study.enqueue_trial({"x": 1})
    assert len(private.cached_trials(study)) == 3
    with relied_on("Study._thread_local.cached_all_trials"):
        private.clear_trials_cache(study)
        assert len(private.cached_trials(study)) == 4, "Study._thread_local.cached_all_trials"


def test_a_system_attr_of_a_running_trial_is_written(storage: BaseStorage) -> None:
    study = optuna.create_study(storage=storage)
    asked = study.ask()
    (running,) = study.get_trials(deepcopy=False)
    with relied_on("Study._storage and FrozenTrial._trial_id"):
        private.set_trial_system_attr(study, running, "optuna_quant:test", [1, 2])
    with relied_on("Study._storage and Trial._trial_id"):
        private.set_trial_system_attr(study, asked, "optuna_quant:beat", 3)
    assert study.get_trials()[0].system_attrs["optuna_quant:test"] == [1, 2]
    assert study.get_trials()[0].system_attrs["optuna_quant:beat"] == 3


def test_a_trial_id_is_what_the_storage_takes(storage: BaseStorage) -> None:
    study = optuna.create_study(storage=storage)
    study.ask()
    (running,) = study.get_trials(deepcopy=False)
    with relied_on("FrozenTrial._trial_id"):
        assert storage.get_trial(private.trial_id(running)).number == running.number


def test_fixed_params_are_enqueue_trials(storage: BaseStorage) -> None:
    study = optuna.create_study(storage=storage)
    study.enqueue_trial({"x": 2})
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, value=0.0))
    waiting, added = study.get_trials(deepcopy=False)
    with relied_on("the 'fixed_params' system attribute of Study.enqueue_trial"):
        assert private.fixed_params(waiting) == {"x": 2}, "enqueue_trial's 'fixed_params' system attribute"
        assert private.fixed_params(added) is None


def test_a_completed_trial_is_logged_as_optimize_logs_it(storage: BaseStorage, caplog: pytest.LogCaptureFixture) -> None:
    study = optuna.create_study(storage=storage)
    trial = study.ask()
    trial.suggest_int("x", 0, 3)
    frozen = study.tell(trial, 1.5)
    optuna.logging.enable_propagation()
    try:
        with caplog.at_level("INFO", logger="optuna"), relied_on("Study._log_completed_trial"):
            private.log_completed_trial(study, frozen)
    finally:
        optuna.logging.disable_propagation()
    assert f"Trial {frozen.number} finished with value: 1.5" in caplog.text


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


def test_a_measurement_is_written_in_one_transaction_as_optuna_writes_it(storage: BaseStorage) -> None:
    study = optuna.create_study(storage=storage)
    by_optuna, ours = study.ask(), study.ask()
    by_optuna.set_user_attr("acc_loss", 0.5)
    by_optuna.set_constraint("accuracy", -0.5)
    commits: list[int] = []
    if isinstance(storage, RDBStorage):
        sqlalchemy.event.listen(storage.engine, "commit", lambda connection: commits.append(1))
    with relied_on("RDBStorage._set_trial_attr_without_commit, Trial._cached_frozen_trial, 'constraints:' keys"):
        private.set_trial_attrs(ours, {"acc_loss": 0.5}, {"accuracy": -0.5})
    assert commits == ([1] if isinstance(storage, RDBStorage) else [])
    written, expected = study.get_trials()[1], study.get_trials()[0]
    assert (written.user_attrs, written.system_attrs) == (expected.user_attrs, expected.system_attrs)
    assert ours.user_attrs == by_optuna.user_attrs
    with pytest.raises(ValueError, match="NaN"):
        private.set_trial_attrs(ours, {}, {"latency": float("nan")})
    study.tell(ours, 1.0)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        private.set_trial_attrs(ours, {"acc_loss": 0.1})


def test_a_trials_parameters_are_written_in_one_transaction_as_suggest_chooses_them(storage: BaseStorage) -> None:
    choices = ("int8", "fp32")
    names = [f"layer:{i}" for i in range(13)]
    distributions = {name: optuna.distributions.CategoricalDistribution(choices) for name in names}
    sampler = optuna.samplers.TPESampler(multivariate=True, n_startup_trials=0, seed=0)
    study = optuna.create_study(storage=storage, sampler=sampler)
    study.optimize(lambda trial: sum(trial.suggest_categorical(name, choices) == "fp32" for name in names), n_trials=2)
    study.enqueue_trial({"layer:0": "fp32"}, skip_if_exists=False)
    commits: list[int] = []
    statements: list[str] = []
    if isinstance(storage, RDBStorage):
        sqlalchemy.event.listen(storage.engine, "commit", lambda connection: commits.append(1))
        sqlalchemy.event.listen(storage.engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    for enqueued in (True, False):
        trial = study.ask()
        trial.relative_params  # the sampler's reads, which suggest would make as well, before the count
        before, statements_before = len(commits), len(statements)
        relied = "Trial._is_fixed_param, _is_relative_param, _CachedStorage's cache, models.TrialParamModel"
        with relied_on(relied):
            private.set_trial_params(trial, distributions)
        written, executed = len(commits) - before, statements[statements_before:]
        suggested = {name: trial.suggest_categorical(name, choices) for name in names}
        # One transaction for every parameter on an RDB storage, and none left for suggest to write;
        # elsewhere suggest writes each as it always does.
        assert (written, len(commits) - before) == ((1, 1) if isinstance(storage, RDBStorage) else (0, 0))
        if isinstance(storage, RDBStorage):  # one read of the trial and one INSERT, not two statements a parameter
            assert [statement.split()[0] for statement in executed] == ["SELECT", "INSERT"], executed
        assert study.get_trials()[trial.number].params == suggested
        assert (suggested["layer:0"] == "fp32") if enqueued else suggested == trial.relative_params
        study.tell(trial, 0.0)
    # A distribution other than the one the study holds is refused, as suggest refuses it, and
    # nothing of the trial's is written.
    study.enqueue_trial({"layer:0": "fp32"}, skip_if_exists=False)
    trial = study.ask()
    widened = {**distributions, "layer:0": optuna.distributions.CategoricalDistribution((*choices, "int4"))}
    with pytest.raises(ValueError, match="CategoricalDistribution"):
        private.set_trial_params(trial, widened)
        trial.suggest_categorical("layer:0", (*choices, "int4"))
    assert study.get_trials()[trial.number].params == {}
