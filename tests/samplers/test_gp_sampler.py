"""Tests of the discrete Bayesian optimisation pieces and of DiscreteGPSampler."""

from __future__ import annotations

import itertools

import numpy as np
import optuna
import pytest

from optuna_quant.samplers._discrete import History
from optuna_quant.samplers._gp import acq_max
from optuna_quant.samplers._gp import BayesianOptimization
from optuna_quant.samplers._gp import ConstrainedExpectedImprovement
from optuna_quant.samplers._gp import DiscreteGPSampler
from optuna_quant.samplers._gp import ExpectedImprovement
from optuna_quant.samplers._gp import TargetSpace
from optuna_quant.samplers._gp import UpperConfidenceBound
from optuna_quant.samplers._gp.acqf import _log_h
from optuna_quant.samplers._gp.gp import DiscreteGP


optuna.logging.set_verbosity(optuna.logging.WARNING)


# -- TargetSpace ---------------------------------------------------------------------------------


def test_target_space_register_and_lookup() -> None:
    space = TargetSpace({"b": (0, 3), "a": (0, 2)}, random_seed=0)
    assert space.keys == ["a", "b"] and space.dim == 2 and space.empty
    np.testing.assert_array_equal(space.bounds, [[0, 2], [0, 3]])
    space.register({"a": 1, "b": 2}, 0.5)
    space.register(np.array([0, 1]), 0.7)
    assert not space.empty and len(space) == 2
    assert {"a": 1, "b": 2} in space and [0, 1] in space and [1, 1] not in space
    assert space.get_target([1, 2]) == 0.5
    np.testing.assert_array_equal(space.params, [[1, 2], [0, 1]])
    np.testing.assert_array_equal(space.target, [0.5, 0.7])
    assert space.max() == {"target": 0.7, "params": {"a": 0, "b": 1}}
    assert space.res() == [
        {"target": 0.5, "params": {"a": 1, "b": 2}},
        {"target": 0.7, "params": {"a": 0, "b": 1}},
    ]
    with pytest.raises(KeyError):
        space.get_target([1, 1])


def test_target_space_rejects_duplicates() -> None:
    space = TargetSpace({"a": (0, 2), "b": (0, 3)})
    space.register({"a": 1, "b": 2}, 0.5)
    with pytest.raises(KeyError, match="not unique"):
        space.register(np.array([1, 2]), 0.9)
    assert len(space) == 1 and space.get_target([1, 2]) == 0.5


def test_target_space_appends_are_amortised() -> None:
    space = TargetSpace({f"x{i}": (0, 2) for i in range(13)})
    capacities = set()
    for i, config in enumerate(itertools.product(range(2), repeat=13)):
        space.register(np.array(config), float(i))
        capacities.add(len(space._params))
    # Doubling capacity: a logarithmic number of reallocations, not one per append.
    assert len(space) == 2**13 and len(capacities) <= 14
    assert space.target[-1] == 2**13 - 1 and space.max()["target"] == 2**13 - 1


def test_target_space_conversions() -> None:
    space = TargetSpace({"a": (0, 2), "b": (0, 3)})
    x = space.params_to_array({"b": 2, "a": 1})
    np.testing.assert_array_equal(x, [1, 2])
    assert space.array_to_params(x) == {"a": 1, "b": 2}
    with pytest.raises(ValueError):
        space.params_to_array({"a": 1})
    with pytest.raises(ValueError):
        space.array_to_params([1, 2, 3])
    with pytest.raises(ValueError):
        TargetSpace({"a": (0, 1.5)})


def test_target_space_random_sample_is_seeded_and_within_bounds() -> None:
    a = TargetSpace({"a": (0, 2), "b": (3, 7)}, random_seed=5)
    b = TargetSpace({"a": (0, 2), "b": (3, 7)}, random_seed=5)
    samples = np.array([a.random_sample() for _ in range(200)])
    np.testing.assert_array_equal(samples, [b.random_sample() for _ in range(200)])
    assert samples.dtype.kind == "i"
    assert set(samples[:, 0]) == {0, 1} and set(samples[:, 1]) == {3, 4, 5, 6}


def test_target_space_constraints() -> None:
    space = TargetSpace({"a": (0, 4)})
    space.register([0], 5.0, constraints=[1.0])  # infeasible
    space.register([1], 1.0, constraints=[-1.0])
    space.register([2], 2.0, constraints=[0.0])
    np.testing.assert_array_equal(space.feasible, [False, True, True])
    assert space.max() == {"target": 2.0, "params": {"a": 2}}
    assert space.res()[0]["constraints"] == [1.0]
    with pytest.raises(ValueError):
        space.register([3], 1.0)  # constraints for some points and not for others
    unconstrained = TargetSpace({"a": (0, 3)})
    unconstrained.register([0], 1.0)
    with pytest.raises(ValueError):
        unconstrained.register([1], 1.0, constraints=[0.0])


# -- the GP --------------------------------------------------------------------------------------


def test_gp_interpolates_and_is_unsure_away_from_data() -> None:
    rng = np.random.RandomState(0)
    n_choices = [2, 2, 2, 2, 4]
    X = np.array(list(itertools.product(*[range(n) for n in n_choices])))
    y = X[:, 0] * 2.0 + (X[:, 1] == X[:, 2]) + 0.5 * X[:, 4]
    train = rng.choice(len(X), 30, replace=False)
    gp = DiscreteGP(n_choices, ordinal=[False] * 4 + [True]).fit(X[train], y[train])
    mean, std = gp.predict(X, return_std=True)
    assert np.corrcoef(mean, y)[0, 1] > 0.9
    unseen = np.setdiff1d(np.arange(len(X)), train)
    assert np.median(std[train]) < np.median(std[unseen])


def test_gp_pending_points_lose_their_uncertainty() -> None:
    X = np.array([[0, 0], [1, 1], [2, 0]])
    gp = DiscreteGP([3, 2]).fit(X, np.array([0.0, 1.0, 2.0]))
    pending = np.array([[0, 1]])
    before = gp.predict(pending, return_std=True)[1][0]
    believer = gp.with_pending(pending)
    after = believer.predict(pending, return_std=True)[1][0]
    assert after < 0.5 * before
    assert gp.predict(pending, return_std=True)[1][0] == before  # the original is untouched


def test_log_h_is_stable() -> None:
    from scipy.stats import norm

    z = np.linspace(-5, 5, 41)
    np.testing.assert_allclose(_log_h(z), np.log(norm.pdf(z) + z * norm.cdf(z)), rtol=1e-6)
    far = _log_h(np.array([-50.0, -1e4]))
    assert np.all(np.isfinite(far)) and far[1] < far[0]


# -- acq_max -------------------------------------------------------------------------------------


def _fitted_gp(n_choices: list[int], seed: int = 0, n: int = 12) -> tuple[DiscreteGP, np.ndarray]:
    rng = np.random.RandomState(seed)
    X = (rng.random_sample((n, len(n_choices))) * n_choices).astype(int)
    y = X.sum(axis=1) + rng.normal(scale=0.1, size=n)
    return DiscreteGP(n_choices).fit(X, y), X


def test_acq_max_scores_a_small_space_exactly() -> None:
    gp, X = _fitted_gp([3, 3, 2])
    bounds = np.array([[0, 3], [0, 3], [0, 2]])
    exclude = {tuple(x) for x in X.tolist()}
    ac = UpperConfidenceBound()
    x = acq_max(ac, gp, None, bounds, 0, exclude=exclude)
    grid = np.array([c for c in itertools.product(range(3), range(3), range(2)) if c not in exclude])
    assert tuple(x.tolist()) not in exclude
    assert ac(x[None, :], gp, None)[0] == pytest.approx(ac(grid, gp, None).max())


def test_acq_max_on_a_large_space_returns_a_valid_unseen_point() -> None:
    n_choices = [2] * 20 + [5] * 3
    gp, X = _fitted_gp(n_choices, n=30)
    bounds = np.array([[0, n] for n in n_choices])
    exclude = {tuple(x) for x in X.tolist()}
    rng = np.random.RandomState(0)
    x = acq_max(
        ExpectedImprovement(), gp, 20.0, bounds, rng, n_warmup=200, n_iter=3, exclude=exclude, anchors=X[:3]
    )
    assert x.shape == (len(n_choices),) and np.all((x >= 0) & (x < n_choices))
    assert tuple(x.tolist()) not in exclude
    # The local search climbs: the objective grows with every index, so the point is high.
    assert x.sum() > np.mean(X.sum(axis=1))


def test_acq_max_local_searches_each_score_every_neighbour_even_shared_ones() -> None:
    # A 3 x 3 space scored by local search (n_warmup below its size): searches from distinct
    # starts share neighbours, and each must still be free to move to them.
    batches = []

    def ac(x: np.ndarray, gp: object, y_max: float | None) -> np.ndarray:
        batches.append(len(x))
        return -np.abs(x - 1).sum(axis=1).astype(float)

    x = acq_max(ac, None, None, np.array([[0, 3], [0, 3]]), 0, n_warmup=6, n_iter=8)
    assert x.tolist() == [1, 1]
    starts = min(8, batches[0])
    assert starts >= 3  # several searches, so that some share neighbours
    assert batches[1] == starts * 4  # each start's four one-flip neighbours, none dropped


def test_acq_max_honours_shifted_bounds_and_raises_when_all_excluded() -> None:
    gp = DiscreteGP([2]).fit(np.array([[0], [1]]), np.array([0.0, 1.0]))

    class Shifted:
        def predict(self, x: np.ndarray, return_std: bool = False):
            return gp.predict(x - 5, return_std=return_std)

    x = acq_max(UpperConfidenceBound(), Shifted(), None, np.array([[5, 7]]), 0, exclude={(5,)})
    assert x.tolist() == [6]
    with pytest.raises(ValueError, match="excluded"):
        acq_max(UpperConfidenceBound(), gp, None, np.array([[0, 2]]), 0, exclude={(0,), (1,)})


def test_constrained_acquisition_prefers_feasible_points() -> None:
    X = np.array([[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [2, 1]])
    constraint = DiscreteGP([3, 2]).fit(X, np.where(X[:, 0] == 2, -1.0, 1.0))
    target = DiscreteGP([3, 2]).fit(X, X[:, 1].astype(float))
    ac = ConstrainedExpectedImprovement([constraint])
    scores = ac(X, gp=target, y_max=None)
    assert np.argmax(scores) in (4, 5)


# -- BayesianOptimization ------------------------------------------------------------------------


def test_bayesian_optimization_finds_the_maximum_without_repeats() -> None:
    pbounds = {"x": (0, 6), "y": (0, 5), "z": (0, 2)}
    bo = BayesianOptimization(pbounds, random_seed=1, ordinal=["x", "y"])

    def f(p: dict[str, int]) -> float:
        return -((p["x"] - 4) ** 2) - (p["y"] - 1) ** 2 + 2 * p["z"]

    for _ in range(25):
        params = bo.suggest()
        bo.space.register(params, f(params))  # raises KeyError on a repeat
    assert bo.max["target"] == 2 and bo.max["params"] == {"x": 4, "y": 1, "z": 1}
    assert len(bo.res) == 25 and bo.gen_next_params() not in [r["params"] for r in bo.res]
    with pytest.raises(ValueError):
        BayesianOptimization({"x": (1, 4)})
    with pytest.raises(ValueError):
        BayesianOptimization({"x": (0, 4)}, acquisition="pi")


# -- DiscreteGPSampler ---------------------------------------------------------------------------

CHOICES = {"a": [0, 1], "b": [0, 1], "c": [0, 1], "d": [0, 1], "mode": ["x", "y", "z"]}


def _needle(trial: optuna.Trial) -> float:
    """A 240-configuration function with a single optimum (value 0) at a=b=c=d=1, e=3, mode=z."""
    bits = [trial.suggest_categorical(k, CHOICES[k]) for k in "abcd"]
    e = trial.suggest_int("e", 0, 4)
    mode = trial.suggest_categorical("mode", CHOICES["mode"])
    return float(sum(1 - b for b in bits) * 1.5 + abs(e - 3) + {"x": 2.0, "y": 1.0, "z": 0.0}[mode])


def _trials_to_optimum(sampler: optuna.samplers.BaseSampler, budget: int = 120) -> int:
    study = optuna.create_study(sampler=sampler)
    for i in range(budget):
        trial = study.ask()
        value = _needle(trial)
        study.tell(trial, value)
        if value == 0:
            return i + 1
    return budget + 1


def test_sampler_beats_random_over_seeds() -> None:
    gp = [_trials_to_optimum(DiscreteGPSampler(seed=s)) for s in range(5)]
    rnd = [_trials_to_optimum(optuna.samplers.RandomSampler(seed=s)) for s in range(5)]
    # 240 configurations: random search needs about 120 trials on average, the GP a few dozen.
    assert np.median(gp) <= 40
    assert np.median(gp) < 0.5 * np.median(rnd)


def test_sampler_exhausts_a_tiny_space_without_repeats() -> None:
    sampler = DiscreteGPSampler(seed=3)
    study = optuna.create_study(sampler=sampler)

    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_categorical("x", ["p", "q", "r"])
        y = trial.suggest_int("y", 0, 3)
        z = trial.suggest_categorical("z", [True, False])
        return {"p": 0, "q": 1, "r": 2}[x] + y + z

    study.optimize(objective, n_trials=24)
    configs = [tuple(t.params[k] for k in "xyz") for t in study.trials]
    assert len(set(configs)) == 24  # each of the 3 * 4 * 2 configurations exactly once
    study.optimize(objective, n_trials=2)  # an exhausted space repeats instead of failing
    assert len(study.trials) == 26
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials[24:])


def test_sampler_skips_failed_pruned_and_running_configurations() -> None:
    study = optuna.create_study(sampler=DiscreteGPSampler(seed=0, n_startup_trials=2))

    def ask_config() -> tuple[optuna.Trial, tuple]:
        trial = study.ask()
        config = (trial.suggest_categorical("u", [0, 1, 2]), trial.suggest_categorical("v", [0, 1, 2]))
        return trial, config

    seen = []
    for i in range(9):
        trial, config = ask_config()
        seen.append(config)
        if i % 3 == 0:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        elif i % 3 == 1:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        elif i < 6:
            study.tell(trial, float(sum(config)))
        # The last few stay running, as if other workers were evaluating them.
    assert len(set(seen)) == 9


def test_a_pruned_trial_with_a_reported_value_is_an_observation() -> None:
    study = optuna.create_study()
    distributions = {"u": optuna.distributions.CategoricalDistribution([0, 1, 2])}
    for u, reported in ((0, 3.0), (1, None), (2, 1.0)):
        study.enqueue_trial({"u": u})
        trial = study.ask(distributions)
        if reported is not None:
            trial.report(reported, 0)
        study.tell(trial, 1.0 if u == 2 else None, state=None if u == 2 else optuna.trial.TrialState.PRUNED)
    history = History.collect(study, study.trials, lambda t: [t.params["u"]], 1)
    # The pruned trial keeps its last report as its value (Optuna's tell); the one without, only its config.
    assert history.configs.tolist() == [[0], [2]] and history.values.tolist() == [3.0, 1.0]
    assert history.seen == {(0,), (1,), (2,)}


def test_sampler_honours_constraints() -> None:
    def objective(trial: optuna.Trial) -> float:
        bits = [trial.suggest_categorical(f"l{i}", ["int8", "fp32"]) for i in range(6)]
        est = trial.suggest_categorical("est", ["minmax", "entropy", "percentile"])
        n_int8 = bits.count("int8")
        calibration = {"minmax": 0.003, "entropy": 0.001, "percentile": 0.0}[est]
        acc_loss = 0.002 * n_int8 + (0.004 if bits[0] == "int8" else 0) + calibration
        speed = 1.0 + 0.3 * n_int8
        trial.set_constraint("accuracy", acc_loss - 0.01)
        trial.set_constraint("latency", 2.2 - speed)
        return -speed

    hits = []
    for seed in range(3):
        study = optuna.create_study(sampler=DiscreteGPSampler(seed=seed))
        study.optimize(objective, n_trials=40)
        feasible = [t for t in study.trials if all(v <= 0 for v in t.constraints.values())]
        assert feasible, "no feasible trial in 40"
        hits.append(min(t.number for t in feasible) + 1)
        # The best feasible value: 5 layers in int8 except l0, percentile (speed 2.5).
        assert min(t.value for t in feasible) == pytest.approx(-2.5)
    # 3 of the 192 configurations are feasible: random search would need about 64 trials.
    assert np.median(hits) <= 25


def test_sampler_is_reproducible() -> None:
    def run(seed: int) -> list[dict]:
        study = optuna.create_study(sampler=DiscreteGPSampler(seed=seed))
        study.optimize(_needle, n_trials=15)
        return [t.params for t in study.trials]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_sampler_rejects_continuous_parameters() -> None:
    study = optuna.create_study(sampler=DiscreteGPSampler(seed=0))
    with pytest.raises(ValueError, match="'lr'.*continuous"):
        study.optimize(lambda t: t.suggest_float("lr", 1e-4, 1e-1, log=True), n_trials=1)


def test_sampler_handles_integer_and_stepped_float_parameters() -> None:
    def objective(trial: optuna.Trial) -> float:
        n = trial.suggest_int("n", 0, 8, step=2)
        r = trial.suggest_float("r", 0.0, 1.0, step=0.25)
        k = trial.suggest_int("k", 1, 8, log=True)
        return (n - 4) ** 2 + (r - 0.75) ** 2 + abs(k - 3)

    study = optuna.create_study(sampler=DiscreteGPSampler(seed=0))
    study.optimize(objective, n_trials=30)
    configs = [(t.params["n"], t.params["r"], t.params["k"]) for t in study.trials]
    assert len(set(configs)) == 30
    assert {n for n, _, _ in configs} <= {0, 2, 4, 6, 8}
    assert {r for _, r, _ in configs} <= {0.0, 0.25, 0.5, 0.75, 1.0}
    assert {k for _, _, k in configs} <= set(range(1, 9))
    assert study.best_value == 0


def test_sampler_samples_parameters_outside_the_shared_space_at_random() -> None:
    def objective(trial: optuna.Trial) -> float:
        x = trial.suggest_categorical("x", [0, 1, 2, 3])
        if x == 0:
            trial.suggest_categorical("extra", ["a", "b"])
        return float(x)

    study = optuna.create_study(sampler=DiscreteGPSampler(seed=0))
    study.optimize(objective, n_trials=4)
    assert sorted(t.params["x"] for t in study.trials) == [0, 1, 2, 3]
    assert ["extra" in t.params for t in study.trials] == [t.params["x"] == 0 for t in study.trials]
    extras = set()
    for seed in range(6):
        other = optuna.create_study(sampler=DiscreteGPSampler(seed=seed))
        other.optimize(objective, n_trials=4)
        extras |= {t.params["extra"] for t in other.trials if t.params["x"] == 0}
    assert extras == {"a", "b"}


def test_sampler_reseed_changes_the_sequence() -> None:
    reseeded, fresh = DiscreteGPSampler(seed=0), DiscreteGPSampler(seed=0)
    reseeded.reseed_rng()
    assert reseeded._rng.randint(1 << 30) != fresh._rng.randint(1 << 30)


def test_a_failed_acquisition_search_falls_back_to_an_unseen_random_configuration() -> None:
    # Without local search, a space too large to list leaves acq_max no candidate: it raises,
    # and the sampler must still propose something new rather than fail the trial.
    sampler = DiscreteGPSampler(seed=0, n_startup_trials=2, n_local_search=0)
    study = optuna.create_study(sampler=sampler)
    study.optimize(lambda t: sum(t.suggest_int(f"b{i}", 0, 1) for i in range(20)), n_trials=5)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    assert len({tuple(sorted(t.params.items())) for t in study.trials}) == 5
