"""POT's trials_load_method: which study a run works on, what it deletes, and nothing before the checks."""

from __future__ import annotations

import logging

import optuna
from optuna.trial import TrialState
import pytest

from optuna_quant.measure.loss import Targets
from optuna_quant.storages.artifacts import NotWritableError
from optuna_quant.study.load_methods import LoadPlan
from optuna_quant.study.load_methods import open_study
from optuna_quant.study.load_methods import plan_load
from optuna_quant.trial import records
from optuna_quant.trial.space import SearchSpace


SPACE = SearchSpace(nodes=("conv", "fc"), scopes=frozenset({"layer", "granularity"}))
TARGETS = Targets(accuracy_loss=1.0)
SCOPES = ("layer",)
BEST = {"layer:conv": "fp32", "layer:fc": "int8", "granularity": "per_tensor"}
OTHER = {"layer:conv": "int8", "layer:fc": "int8", "granularity": "per_channel"}


def _stored_study(storage: optuna.storages.BaseStorage, *results: tuple[dict, float, float]) -> optuna.Study:
    """Study 'demo' as create_study leaves it, with a completed trial per ``(params, acc_loss, lat_diff)``."""
    study = optuna.create_study(study_name="demo", storage=storage)
    records.share_records(study, space=SPACE, fingerprint="abc", targets=TARGETS, int8_class="x86-vnni")
    for params, acc_loss, lat_diff in results:
        study.add_trial(optuna.trial.create_trial(
            value=0.0, params=params, distributions=SPACE.distributions(),
            user_attrs={"acc_loss": acc_loss, "lat_diff": lat_diff},
        ))
    return study


def _plan(method: str, storage: optuna.storages.BaseStorage) -> LoadPlan:
    return plan_load(method, "demo", storage, scopes=SCOPES, targets=TARGETS)


def _open(plan: LoadPlan, storage: optuna.storages.BaseStorage, objective_mode: str = "loss") -> optuna.Study:
    return open_study(plan, storage, optuna.samplers.RandomSampler(), objective_mode)


def test_cold_start_deletes_the_existing_study_once_opened(caplog) -> None:
    caplog.set_level(logging.INFO, logger="optuna_quant")
    storage = optuna.storages.InMemoryStorage()
    _stored_study(storage, (OTHER, 0.0, 1.2))
    plan = _plan("cold_start", storage)
    assert (plan.method, plan.name, plan.space) == ("cold_start", "demo", None)
    assert plan.existing is not None and len(plan.existing.trials) == 1  # planning deletes nothing
    study = _open(plan, storage)
    assert study.trials == [] and study.user_attrs == {}
    assert "cold_start: deleting the existing study 'demo'." in caplog.messages


@pytest.mark.parametrize(("method", "space"), [("warm_start", None), ("eval", SPACE)])
def test_warm_start_and_eval_open_the_stored_study(method: str, space: SearchSpace | None) -> None:
    storage = optuna.storages.InMemoryStorage()
    _stored_study(storage, (BEST, 0.005, 1.9))
    plan = _plan(method, storage)
    # eval rebuilds models of the stored space; warm_start takes the model's, checked by share_records.
    assert (plan.method, plan.name, plan.space) == (method, "demo", space)
    study = _open(plan, storage)
    assert [t.params for t in study.trials] == [BEST] and records.stored_space(study) == SPACE


def test_a_study_of_another_objective_mode_is_refused() -> None:
    storage = optuna.storages.InMemoryStorage()
    _stored_study(storage)
    with pytest.raises(ValueError, match="Study 'demo' has 1 objective\\(s\\), not 'pareto' mode's 2"):
        _open(_plan("warm_start", storage), storage, "pareto")


def test_fine_tune_narrows_a_new_study_around_the_best_trial(caplog) -> None:
    caplog.set_level(logging.INFO, logger="optuna_quant")
    storage = optuna.storages.InMemoryStorage()
    _stored_study(storage, (OTHER, 0.0, 1.2), (BEST, 0.005, 1.9), (OTHER, 0.02, 3.0))
    plan = _plan("fine_tune", storage)
    assert (plan.method, plan.name, plan.existing) == ("fine_tune", "demo-fine_tune", None)
    assert plan.space == SPACE.narrow(SPACE.to_config(BEST), SCOPES)
    assert sorted(plan.space.distributions()) == ["layer:conv", "layer:fc"]  # granularity fixed at the best's
    assert not plan.space.base.per_channel and plan.space.base.fallback == {"conv"}
    assert "fine_tune: narrowing to ['layer'] around trial 1." in caplog.messages
    study = _open(plan, storage)
    assert study.study_name == "demo-fine_tune" and study.trials == []
    assert len(optuna.load_study(study_name="demo", storage=storage).trials) == 3  # the previous study stays


def test_fine_tune_without_a_completed_trial_is_refused() -> None:
    storage = optuna.storages.InMemoryStorage()
    _stored_study(storage).add_trial(optuna.trial.create_trial(state=TrialState.FAIL))
    with pytest.raises(ValueError, match="Study 'demo' has no completed trial to fine-tune around"):
        _plan("fine_tune", storage)


def test_eval_refuses_a_missing_study_and_one_made_outside_optuna_quant() -> None:
    storage = optuna.storages.InMemoryStorage()
    with pytest.raises(ValueError, match="No study 'demo' in .* to evaluate; run the tuning first"):
        _plan("eval", storage)
    optuna.create_study(study_name="demo", storage=storage)
    with pytest.raises(ValueError, match="holds no optuna-quant search space"):
        _plan("eval", storage)


@pytest.mark.parametrize(("method", "line"), [
    ("warm_start", "No study 'demo' to warm-start: starting with cold_start."),
    ("fine_tune", "No study 'demo' to fine-tune: starting with cold_start."),
])
def test_a_missing_study_falls_back_to_cold_start_with_a_log_line(caplog, method: str, line: str) -> None:
    caplog.set_level(logging.INFO, logger="optuna_quant")
    storage = optuna.storages.InMemoryStorage()
    plan = _plan(method, storage)
    assert (plan.method, plan.name, plan.space, plan.existing) == ("cold_start", "demo", None, None)
    assert line in caplog.messages
    assert _open(plan, storage).study_name == "demo"


def test_an_unknown_method_is_refused() -> None:
    with pytest.raises(ValueError, match="Unknown trials_load_method 'hot_start'"):
        _plan("hot_start", optuna.storages.InMemoryStorage())


def test_eval_of_a_missing_study_names_study_and_storage(make_study) -> None:
    with pytest.raises(ValueError, match=r"No study 'nothing-here' in sqlite:///.*study\.db"):
        make_study(study_name="nothing-here", trials_load_method="eval")


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


def test_warm_start_from_a_cpu_of_another_int8_class_is_refused_before_anything_else() -> None:
    storage = optuna.storages.InMemoryStorage()
    _stored_study(storage, (BEST, 0.0, 2.0))
    with pytest.raises(ValueError, match="tuned on CPUs of int8 class 'x86-vnni'; this machine's is 'arm-dotprod'"):
        plan_load("warm_start", "demo", storage, scopes=SCOPES, targets=TARGETS, int8_class="arm-dotprod")
    assert plan_load("warm_start", "demo", storage, scopes=SCOPES, targets=TARGETS, int8_class="x86-vnni").existing
    # A study of its own for the other class: cold_start replaces, fine_tune makes a new one.
    assert plan_load("fine_tune", "demo", storage, scopes=SCOPES, targets=TARGETS, int8_class="arm-dotprod").name == "demo-fine_tune"
