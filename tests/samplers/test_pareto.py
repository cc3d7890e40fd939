"""Every built-in sampler runs a two-objective study: optuna-quant's ``objective_mode="pareto"`` on a
real model, and a plain Optuna study long enough for the models of both of optuna-quant's samplers."""

from __future__ import annotations

import optuna
import pytest

from optuna_quant.samplers import DiscreteGPSampler
from optuna_quant.samplers import TPESampler
from optuna_quant.samplers.factory import SAMPLER_NAMES


optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.mark.parametrize("sampler", SAMPLER_NAMES)
def test_pareto_mode_runs_with_every_built_in_sampler(make_study, sampler: str) -> None:
    study = make_study(accuracy_loss=50.0, latency_reduce=0.1, objective_mode="pareto", sampler=sampler)
    study.optimize(n_trials=5)
    trials = study.study.trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 5
    for trial in trials:
        assert trial.values == [trial.user_attrs["acc_loss"], trial.user_attrs["lat_diff"]]
    assert len({tuple(sorted(t.params.items())) for t in trials}) == 5


def trade_off(trial: optuna.Trial) -> tuple[float, float]:
    """Each int8 layer gains speed and costs accuracy, layer 3 much more: a real trade-off."""
    int8 = [trial.suggest_categorical(f"l{i}", ["int8", "fp32"]) == "int8" for i in range(6)]
    cost = [1.0, 1.0, 1.0, 8.0, 1.0, 1.0]
    acc_loss = sum(c for c, q in zip(cost, int8) if q)
    lat_diff = 1.0 + sum(int8)
    trial.set_constraint("acc_loss", acc_loss - 4.0)
    return acc_loss, lat_diff


@pytest.mark.parametrize(
    "sampler", [TPESampler(n_startup_trials=5, seed=0), DiscreteGPSampler(seed=0)], ids=["tpe", "gp"]
)
def test_model_based_sampling_on_two_objectives(sampler: optuna.samplers.BaseSampler) -> None:
    study = optuna.create_study(directions=["minimize", "maximize"], sampler=sampler)
    study.optimize(trade_off, n_trials=25)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert len({tuple(sorted(t.params.items())) for t in study.trials}) == 25  # never a repeat
    # The feasible front: layer 3 in fp32 and k of the other five in int8, k = 0..4.
    front = {tuple(t.values) for t in study.best_trials}
    assert front <= {(float(k), 1.0 + k) for k in range(5)}
    assert (4.0, 5.0) in front  # the fastest configuration within the constraint
