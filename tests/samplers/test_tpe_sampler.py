"""optuna-quant's TPESampler: the split, the never-repeat rule, the POT preset, plain studies."""

from __future__ import annotations

import functools
import math

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution
from optuna.distributions import FloatDistribution
from optuna.distributions import IntDistribution
import pytest

from optuna_quant.samplers import TPESampler
from optuna_quant.samplers._discrete import constraint_matrix
from optuna_quant.samplers._tpe.candidates import best_unseen_combination
from optuna_quant.samplers._tpe.sampler import quantile_gamma
from optuna_quant.samplers._tpe.sampler import split_good_bad
from optuna_quant.samplers._tpe.sampler import sqrt_gamma
from optuna_quant.samplers._tpe.search_space import min_choices


optuna.logging.set_verbosity(optuna.logging.WARNING)

MODES = {
    "independent": dict(n_startup_trials=3, multivariate=False),
    "multivariate": dict(n_startup_trials=3, multivariate=True),
}


def make(mode: str, seed: int = 0) -> TPESampler:
    if mode == "pot":
        return TPESampler.pot(seed=seed)
    return TPESampler(seed=seed, **MODES[mode])


def tiny_objective(trial: optuna.Trial) -> float:
    a = trial.suggest_categorical("a", ["x", "y", "z"])
    b = trial.suggest_int("b", 0, 3)
    c = trial.suggest_float("c", 0.0, 1.0, step=0.5)
    return {"x": 0.0, "y": 1.0, "z": 2.0}[a] + b + c


def config(trial: optuna.trial.FrozenTrial) -> tuple:
    return tuple(sorted(trial.params.items()))


# ---- the split ------------------------------------------------------------------------------


def test_split_by_value() -> None:
    values = np.array([5.0, 1.0, 4.0, 2.0, 3.0])
    good, bad = split_good_bad(values, None, lambda n: 2)
    assert good.tolist() == [1, 3] and bad.tolist() == [0, 2, 4]


def test_split_puts_feasible_first_then_infeasible_by_total_violation() -> None:
    values = np.array([0.0, 9.0, 1.0, 5.0, 2.0])
    constraints = np.array(
        [
            [0.5, 0.5],  # infeasible, violation 1.0, best value
            [-1.0, 0.0],  # feasible, worst value
            [0.2, -3.0],  # infeasible, violation 0.2
            [-1.0, -1.0],  # feasible
            [0.1, 0.2],  # infeasible, violation 0.3
        ]
    )
    order = lambda k: split_good_bad(values, constraints, lambda n: k)[0].tolist()  # noqa: E731
    assert order(1) == [3]
    assert order(2) == [1, 3]
    assert order(3) == [1, 2, 3]
    assert order(4) == [1, 2, 3, 4]


def test_violations_count_in_units_of_each_constraint() -> None:
    # Accuracy-like constraint of typical size 0.01, latency-like of typical size 1: trial 0
    # misses accuracy by 0.02 (two units), trial 1 misses latency by 0.5 (half a unit).
    values = np.zeros(6)
    constraints = np.array(
        [[0.02, -1.0], [-0.01, 0.5], [-0.01, -1.0], [0.01, -1.0], [-0.01, 1.0], [0.01, 1.0]]
    )
    # Trial 2 is the only feasible one; then trial 1 (0.5 units) beats trial 0 (2 units).
    assert split_good_bad(values, constraints, lambda n: 2)[0].tolist() == [1, 2]


def test_missing_constraints_count_as_infeasible() -> None:
    values = np.array([0.0, 1.0, 2.0])
    # The sampler's own conversion: a trial without a constraint that others carry violates it
    # infinitely; no constraint anywhere gives no matrix at all.
    constraints = constraint_matrix([{}, {"c": -1.0}, {"c": 1.0}])
    assert constraints is not None and constraints.shape == (3, 1)
    assert constraints.tolist() == [[math.inf], [-1.0], [1.0]]
    assert constraint_matrix([{}, {}]) is None
    assert split_good_bad(values, constraints, lambda n: 2)[0].tolist() == [1, 2]


def test_gamma_rules() -> None:
    assert [quantile_gamma(0.1, n) for n in (1, 10, 11, 100, 400)] == [1, 1, 2, 10, 25]
    assert [sqrt_gamma(0.3, n) for n in (1, 10, 100, 10_000)] == [1, 1, 3, 25]


@pytest.mark.parametrize("multivariate", [False, True])
def test_constraints_steer_the_good_set(multivariate: bool) -> None:
    # The value prefers x = 0, but only x >= 50 is feasible: with the constraint the search must
    # move above 50; without it, it stays low.
    def run(constrained: bool) -> int:
        def objective(trial: optuna.Trial) -> float:
            x = trial.suggest_int("x", 0, 99)
            if constrained:
                trial.set_constraint("c", 50 - x)
            return float(x)

        study = optuna.create_study(sampler=TPESampler(seed=0, multivariate=multivariate))
        study.optimize(objective, n_trials=40)
        return sum(t.params["x"] >= 50 for t in study.trials[20:])

    assert run(True) >= 10 > 5 >= run(False)


def test_constraints_can_be_left_aside() -> None:
    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_int("x", 0, 99)
        trial.set_constraint("c", 50 - x)
        return float(x)

    study = optuna.create_study(sampler=TPESampler(seed=0, constraints=False))
    study.optimize(objective, n_trials=40)
    assert sum(t.params["x"] >= 50 for t in study.trials[20:]) <= 5


# ---- never repeat ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["independent", "multivariate", "pot"])
def test_tiny_space_is_exhausted_each_configuration_once(mode: str) -> None:
    study = optuna.create_study(sampler=make(mode))
    study.optimize(tiny_objective, n_trials=24)  # 3 * 4 * 2 configurations
    assert len({config(t) for t in study.trials}) == 24
    study.optimize(tiny_objective, n_trials=2)  # nothing unseen is left: repeats are allowed
    assert len(study.trials) == 26
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials[24:])


def test_failed_trials_are_not_proposed_again() -> None:
    def objective(trial: optuna.Trial) -> float:
        value = tiny_objective(trial)
        if trial.params["a"] == "x":
            raise RuntimeError("this configuration does not build")
        return value

    study = optuna.create_study(sampler=TPESampler(seed=1, n_startup_trials=2))
    study.optimize(objective, n_trials=24, catch=(RuntimeError,))
    assert len({config(t) for t in study.trials}) == 24


@pytest.mark.parametrize("mode", ["independent", "multivariate"])
def test_running_trials_are_not_proposed_again(mode: str) -> None:
    study = optuna.create_study(sampler=make(mode))
    study.optimize(tiny_objective, n_trials=6)
    running = [study.ask() for _ in range(18)]
    for trial in running:
        tiny_objective(trial)
    assert len({config(t) for t in study.trials}) == 24


def test_best_unseen_combination_is_best_first() -> None:
    scores = [{0: 2.0, 1: 1.0}, {0: 0.5, 1: 0.0, 2: -1.0}]
    assert best_unseen_combination(scores, set()) == (0, 0)
    assert best_unseen_combination(scores, {(0, 0)}) == (0, 1)
    assert best_unseen_combination(scores, {(0, 0), (0, 1)}) == (1, 0)
    every = {(a, b) for a in range(2) for b in range(3)}
    assert best_unseen_combination(scores, every) is None


# ---- reproducibility ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["independent", "multivariate", "pot"])
def test_same_seed_same_study(mode: str) -> None:
    def run(seed: int) -> list[tuple]:
        study = optuna.create_study(sampler=make(mode, seed))
        study.optimize(tiny_objective, n_trials=15)
        return [config(t) for t in study.trials]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_reseed_rng_changes_the_stream() -> None:
    a, b = TPESampler(seed=0), TPESampler(seed=0)
    b.reseed_rng()
    assert a._rng.randint(1 << 30) != b._rng.randint(1 << 30)


# ---- the POT preset -------------------------------------------------------------------------


def test_pot_preset_settings() -> None:
    sampler = TPESampler.pot(seed=0)
    assert sampler._n_startup_trials == 10
    assert not sampler._multivariate and sampler._constant_liar
    assert not sampler._constraints  # POT's TPE knew only the loss
    assert [sampler._gamma(n) for n in (10, 100, 1000)] == [
        math.ceil(0.3 * math.sqrt(n)) for n in (10, 100, 1000)
    ]
    # n_EI_candidates = M and prior_weight = 1 / M are read from the space when sampling.
    assert sampler._n_ei_candidates is None and sampler._prior_weight is None


def test_pot_m_is_the_fewest_choices_above_one() -> None:
    distributions = [
        CategoricalDistribution(["only"]),
        CategoricalDistribution(list("abcde")),
        IntDistribution(0, 6, step=2),
        CategoricalDistribution(list("abc")),
    ]
    assert min_choices(distributions) == 3
    assert min_choices([FloatDistribution(0.0, 1.0)]) is None


def test_pot_preset_draws_m_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    from optuna_quant.samplers._tpe import parzen_estimator as _parzen

    sizes, weights = [], []
    original_sample, original_init = _parzen.UnivariateParzen.sample, _parzen.UnivariateParzen.__init__

    def sample(self, rng, size):  # type: ignore[no-untyped-def]
        sizes.append(size)
        return original_sample(self, rng, size)

    def init(self, observations, dims, w, prior_weight):  # type: ignore[no-untyped-def]
        weights.append(prior_weight)
        original_init(self, observations, dims, w, prior_weight)

    monkeypatch.setattr(_parzen.UnivariateParzen, "sample", sample)
    monkeypatch.setattr(_parzen.UnivariateParzen, "__init__", init)
    study = optuna.create_study(sampler=TPESampler.pot(seed=0))
    study.optimize(tiny_objective, n_trials=12)  # M = 3: a has 3 choices, b 4, c 3 (0, 0.5, 1)
    assert set(sizes) == {3} and set(weights) == {1 / 3}


# ---- any study ------------------------------------------------------------------------------


@pytest.mark.parametrize("multivariate", [False, True])
def test_plain_study_with_numbers(multivariate: bool) -> None:
    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_float("x", -5.0, 5.0)
        n = trial.suggest_int("n", -10, 10)
        lr = trial.suggest_float("lr", 1e-5, 1.0, log=True)
        k = trial.suggest_int("k", 1, 1024, log=True)
        return (x - 1) ** 2 + abs(n - 3) + abs(math.log10(lr) + 3) + abs(math.log2(k) - 4)

    def best(sampler: optuna.samplers.BaseSampler) -> optuna.Study:
        study = optuna.create_study(sampler=sampler)
        study.optimize(objective, n_trials=80)
        return study

    studies = [best(TPESampler(seed=seed, multivariate=multivariate)) for seed in range(3)]
    randoms = [best(optuna.samplers.RandomSampler(seed=seed)) for seed in range(3)]
    assert np.mean([s.best_value for s in studies]) < np.mean([s.best_value for s in randoms])
    for t in studies[0].trials:
        assert -5 <= t.params["x"] <= 5 and -10 <= t.params["n"] <= 10
        assert 1e-5 <= t.params["lr"] <= 1 and 1 <= t.params["k"] <= 1024


def test_huge_integer_range_is_not_listed() -> None:
    def objective(trial: optuna.Trial) -> float:
        return abs(trial.suggest_int("n", 0, 10**12) - 10**11) + trial.suggest_int("k", 0, 3)

    study = optuna.create_study(sampler=TPESampler(seed=0, n_startup_trials=3))
    study.optimize(objective, n_trials=8)
    assert all(0 <= t.params["n"] <= 10**12 for t in study.trials)
    assert len({t.params["n"] for t in study.trials}) == 8


def test_maximize_and_dynamic_parameters() -> None:
    def objective(trial: optuna.Trial) -> float:
        kind = trial.suggest_categorical("kind", ["a", "b"])
        if kind == "a":
            return trial.suggest_float("u", 0.0, 1.0)
        return 0.4 * trial.suggest_int("v", 0, 2)

    study = optuna.create_study(direction="maximize", sampler=TPESampler(seed=0))
    study.optimize(objective, n_trials=40)
    assert study.best_value > 0.9
    assert sum(t.params["kind"] == "a" for t in study.trials[20:]) > 10


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="gamma"):
        TPESampler(gamma=0.0)
    with pytest.raises(ValueError, match="prior_weight"):
        TPESampler(prior_weight=0.0)
    with pytest.raises(ValueError, match="n_ei_candidates"):
        TPESampler(n_ei_candidates=0)
    TPESampler(gamma=functools.partial(sqrt_gamma, 0.5))
