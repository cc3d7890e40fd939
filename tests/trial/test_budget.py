"""The sensitivity's share of the study's time: the plans' estimates, and what a study picks under them."""

from __future__ import annotations

import math

import onnx
from optuna.artifacts import get_all_artifact_meta
from optuna.trial import TrialState
import pytest

from optuna_quant.measure.measurer import Measurer
from optuna_quant.storages.artifacts import model_filename
from optuna_quant.trial import guidance
from optuna_quant.trial.budget import calibration_estimate
from optuna_quant.trial.budget import ENTROPY_SECONDS_PER_TENSOR
from optuna_quant.trial.budget import estimate_seconds
from optuna_quant.trial.budget import PERCENTILE_COST
from optuna_quant.trial.budget import plan_sensitivity
from optuna_quant.trial.budget import planned_seconds
from optuna_quant.trial.budget import PLANS
from optuna_quant.trial.budget import SENSITIVITY_SHARE
from optuna_quant.trial.space import SearchSpace


@pytest.fixture(scope="module")
def bert_space(bert_path) -> SearchSpace:
    return SearchSpace.from_model(onnx.load(str(bert_path)))


@pytest.mark.parametrize("latency_seconds", [0.05, 0.5, 5.0])  # cheap kernels' timing, or the dearest part
def test_the_most_thorough_plan_that_fits_is_picked(bert_space, latency_seconds) -> None:
    costs = {"model_seconds": 0.05, "latency_seconds": latency_seconds}
    estimates = {plan.name: estimate_seconds(bert_space, plan, **costs) for plan in PLANS}
    assert max(estimates.values()) == estimates["full"] and min(estimates.values()) == estimates["scopes_untimed"]
    for budget in sorted(estimates.values()):
        picked = plan_sensitivity(bert_space, budget_seconds=budget, **costs)
        assert picked is not None and picked.estimate_seconds == estimates[picked.name] <= budget
        before = [plan.name for plan in PLANS[: [p.name for p in PLANS].index(picked.name)]]
        assert all(estimates[name] > budget for name in before), (picked.name, budget)
    assert plan_sensitivity(bert_space, budget_seconds=estimates["scopes_untimed"] * 0.99, **costs) is None
    assert plan_sensitivity(bert_space, budget_seconds=math.inf, **costs).name == "full"


def test_a_calibration_not_run_yet_is_counted_where_a_plan_needs_it(bert_space) -> None:
    costs = {"model_seconds": 0.05, "latency_seconds": 0.5}
    cheap = [estimate_seconds(bert_space, plan, **costs) for plan in PLANS]
    dear = {"calibration_seconds": lambda family: 100.0 * (family == "Entropy")}
    entropy = [estimate_seconds(bert_space, plan, **costs, **dear) for plan in PLANS]
    # Every combination holds static entropy; the reference is dynamic, so measured one choice at
    # a time from it, the range estimator builds one model and calibrates nothing.
    assert entropy[0] == pytest.approx(cheap[0] + 100.0)
    assert entropy[1:] == pytest.approx(cheap[1:])


def test_the_planned_time_is_the_budget_of_trials_or_what_is_left_of_the_timeout() -> None:
    assert planned_seconds([1.0, 3.0], n_trials=10, seconds_left=None) == 20.0
    assert planned_seconds([1.0, 3.0], n_trials=10, seconds_left=5.0) == 5.0
    assert planned_seconds([1.0], n_trials=None, seconds_left=-1.0) == 0.0


def test_a_study_with_a_timeout_measures_within_its_share_and_ends_with_an_exported_model(make_study, tmp_path) -> None:
    study = make_study(sampler="tpe", latency_reduce=100.0, artifact_dir=tmp_path / "models")  # never met
    # Only the timeout ends it (a fast machine runs any n_trials within it); long enough for the
    # reference and the recipes on a loaded machine.
    best = study.optimize(n_trials=None, timeout=60.0)
    decision = study.user_attrs["sensitivity_plan"]  # decided between the recipes and the search
    assert 0 < decision["budget_s"] <= SENSITIVITY_SHARE * 60.0
    if decision["plan"] is None:  # even the cheapest plan's estimate was over it
        assert guidance.stored(study.study) is None and decision["estimate_s"] > decision["budget_s"]
    else:
        assert decision["estimate_s"] <= decision["budget_s"]
        assert guidance.stored(study.study).plan == decision["plan"]
    assert best is not None
    stored = [meta.filename for meta in get_all_artifact_meta(study.study)]
    assert stored == [model_filename(best.number)]
    assert study.export_best(tmp_path / "best.onnx").number == best.number


def test_a_study_whose_timeout_passes_before_any_trial_still_ends_with_a_model(make_study, tmp_path) -> None:
    study = make_study(artifact_dir=tmp_path / "models")
    best = study.optimize(n_trials=50, timeout=1e-6)  # past before the first decision: the reference runs
    # The reference queued the recipes, which a later optimize (warm_start) runs first.
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] + [TrialState.WAITING] * (len(study.trials) - 1)
    assert best is not None and best.number == 0
    assert [meta.filename for meta in get_all_artifact_meta(study.study)] == [model_filename(0)]


def test_a_calibration_is_estimated_until_it_has_run_then_costs_nothing(cnn, calib, agreement, fast_bench) -> None:
    measurer = Measurer(cnn, calib, agreement, benchmark=fast_bench)
    estimate = calibration_estimate(measurer)  # runs MinMax, which every static plan needs
    tensors = len(measurer.quantizer.ranges("minmax").data)
    assert tensors > 0 and estimate("MinMax") == 0.0
    assert estimate("Entropy") == pytest.approx(ENTROPY_SECONDS_PER_TENSOR * tensors)
    assert estimate("Percentile") == pytest.approx(PERCENTILE_COST * measurer.quantizer.calibration_seconds["MinMax"])
    measurer.quantizer.ranges("entropy")
    assert calibration_estimate(measurer)("Entropy") == 0.0
