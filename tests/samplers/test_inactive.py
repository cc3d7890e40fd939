"""Inactive parameters: where a choice makes parameters inactive, both samplers treat the
configurations that differ only there as one, and propose none of them once one was tried."""

from __future__ import annotations

import itertools

import numpy as np
import optuna
import pytest

from optuna_quant.samplers import DiscreteGPSampler
from optuna_quant.samplers import TPESampler
from optuna_quant.samplers._discrete import Excluded
from optuna_quant.samplers._tpe.candidates import best_unseen_combination


optuna.logging.set_verbosity(optuna.logging.WARNING)

LAYERS = [f"l{i}" for i in range(6)]
# Under "dynamic" only the first three layers count, as dynamic quantization only reads its MatMuls.
INACTIVE = {"approach": {"dynamic": ["range", *LAYERS[3:]]}}


def objective(trial: optuna.Trial) -> float:
    """Dynamic is better (0 to 3, a unit per fp32 layer of its three); static 2 to 9."""
    approach = trial.suggest_categorical("approach", ["static", "dynamic"])
    layers = [trial.suggest_categorical(name, ["int8", "fp32"]) == "fp32" for name in LAYERS]
    range_ = trial.suggest_categorical("range", ["a", "b", "c"])
    if approach == "dynamic":
        return float(sum(layers[:3]))
    return 2.0 + sum(layers) + (range_ != "a")


def model_of(params: dict) -> tuple:
    """What ``params`` build: the inactive ones left out."""
    if params["approach"] == "dynamic":
        return ("dynamic", *(params[name] for name in LAYERS[:3]))
    return tuple(sorted(params.items()))


@pytest.mark.parametrize(
    "make_sampler",
    [
        lambda: TPESampler(seed=0, n_startup_trials=5),
        lambda: TPESampler.pot(seed=0),
        lambda: DiscreteGPSampler(seed=0, n_startup_trials=5),
    ],
    ids=["tpe", "tpe-pot", "gp"],
)
def test_a_configuration_that_differs_only_in_inactive_parameters_is_not_proposed(make_sampler) -> None:
    sampler = make_sampler()
    sampler.set_inactive(INACTIVE)
    study = optuna.create_study(sampler=sampler)
    study.optimize(objective, n_trials=30)
    models = [model_of(t.params) for t in study.trials]
    assert len(set(models)) == 30
    # The eight dynamic models are the best ones: the samplers try them all, then go on to static ones.
    assert sum(m[0] == "dynamic" for m in models) == 8
    # The control: told nothing, the same sampler builds some model twice.
    control = optuna.create_study(sampler=make_sampler())
    control.optimize(objective, n_trials=30)
    assert len({model_of(t.params) for t in control.trials}) < 30


def test_bad_inactive_parameters_are_refused() -> None:
    for sampler in (TPESampler(), DiscreteGPSampler()):
        for bad in ({"approach": ["range"]}, {"approach": {"dynamic": "range"}}, {"approach": {"dynamic": 3}}):
            with pytest.raises(TypeError, match=r"Inactive parameters are \{param: .*\}, got 'approach'"):
                sampler.set_inactive(bad)
        sampler.set_inactive({"not_a_parameter": {"x": ["y"]}})  # outside the space: left out


def test_the_best_first_search_finds_the_best_combination_outside_every_seen_model() -> None:
    rng = np.random.RandomState(0)
    for _ in range(200):
        n_choices = rng.randint(1, 4, size=5)
        scores = [dict(zip(range(n), rng.normal(size=n).tolist())) for n in n_choices]
        inactive = [(0, 0, (2, 3))] if n_choices[0] > 1 else []
        every = list(itertools.product(*[range(n) for n in n_choices]))
        tried = rng.choice(len(every), size=len(every) // 2, replace=False)
        seen = Excluded([every[i] for i in tried], inactive=inactive)
        free = [c for c in every if c not in seen]
        found = best_unseen_combination(scores, seen)
        if not free:
            assert found is None
            continue
        assert found not in seen
        best = max(sum(s[i] for s, i in zip(scores, c)) for c in free)
        assert sum(s[i] for s, i in zip(scores, found)) == pytest.approx(best)
