"""The per-choice prior of both samplers: checked on input, followed by the estimators, the start-up
draws and the acquisition, settable after construction."""

from __future__ import annotations

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution
import pytest

from optuna_quant.samplers import DiscreteGPSampler
from optuna_quant.samplers import TPESampler
from optuna_quant.samplers._discrete import DiscreteSpace
from optuna_quant.samplers._prior import SpacePrior
from optuna_quant.samplers._prior import validate_prior
from optuna_quant.samplers._tpe.parzen_estimator import MultivariateParzen
from optuna_quant.samplers._tpe.parzen_estimator import UnivariateParzen
from optuna_quant.samplers._tpe.probability_distributions import CategoricalDim


optuna.logging.set_verbosity(optuna.logging.WARNING)

LAYERS = [f"l{i}" for i in range(8)]
# The prior's favourite: fp32 on the odd layers, int8 on the even ones.
GOOD = {name: ("fp32" if i % 2 else "int8") for i, name in enumerate(LAYERS)}
PRIOR = {name: {GOOD[name]: 0.9, ("int8" if GOOD[name] == "fp32" else "fp32"): 0.1} for name in LAYERS}


@pytest.mark.parametrize(
    ("prior", "error", "match"),
    [
        ({"l0": {"fp32": -0.1}}, ValueError, "'fp32' of parameter 'l0' .* got -0.1"),
        ({"l0": {"fp32": 1.0}}, ValueError, r"must lie in \[0, 1\) \(0: never\), got 1.0"),
        ({"l0": {"fp32": float("nan")}}, ValueError, "got nan"),
        ({"l0": {"fp32": "high"}}, ValueError, "got 'high'"),
        ({"l0": 0.5}, TypeError, "Prior of parameter 'l0' must map choices"),
        ([("l0", 0.5)], TypeError, "got list"),
    ],
)
def test_bad_priors_are_refused_at_construction_and_later(prior, error, match) -> None:
    for sampler_class in (TPESampler, DiscreteGPSampler):
        with pytest.raises(error, match=match):
            sampler_class(prior=prior)
        with pytest.raises(error, match=match):
            sampler_class().set_prior(prior)
    assert validate_prior(None) is None


def test_estimators_prior_kernel_follows_the_prior() -> None:
    dims = [CategoricalDim(3, (0.6, 0.3, 0.1)), CategoricalDim(2)]
    no_observations = np.empty((0, 2))
    univariate = UnivariateParzen(no_observations, dims, np.ones(0), prior_weight=1.0)
    probs = np.exp(univariate.log_pdf(np.array([[0, 0], [1, 1], [2, 0]])))
    np.testing.assert_allclose(probs, [[0.6, 0.5], [0.3, 0.5], [0.1, 0.5]])
    multivariate = MultivariateParzen(no_observations, dims, np.ones(0), prior_weight=1.0)
    joint = np.exp(multivariate.log_pdf(np.array([[0, 0], [2, 1]])))
    np.testing.assert_allclose(joint, [0.3, 0.05])
    # One observation of choice 2: pseudo-counts 3 * (0.6, 0.3, 0.1) plus the count.
    observed = UnivariateParzen(np.array([[2, 0]]), dims, np.ones(1), prior_weight=1.0)
    np.testing.assert_allclose(np.exp(observed.log_pdf(np.array([[2, 0]])))[0, 0], (0.3 + 1.0) / 4.0)


def objective(trial: optuna.Trial) -> float:
    """Lowest (0) at the prior's favourite configuration, one per layer that differs."""
    return float(sum(trial.suggest_categorical(name, ["int8", "fp32"]) != GOOD[name] for name in LAYERS))


def agreement_with_prior(study: optuna.Study) -> float:
    return float(np.mean([[t.params[name] == GOOD[name] for name in LAYERS] for t in study.trials]))


@pytest.mark.parametrize("sampler_class", [TPESampler, DiscreteGPSampler], ids=["tpe", "gp"])
def test_start_up_draws_follow_the_prior_set_after_construction(sampler_class) -> None:
    # Start-up trials only: what they draw comes from the prior, or uniformly without one.
    n = 12
    with_prior = sampler_class(seed=0, n_startup_trials=n)
    with_prior.set_prior(PRIOR)
    study = optuna.create_study(sampler=with_prior)
    study.optimize(objective, n_trials=n)
    plain = optuna.create_study(sampler=sampler_class(seed=0, n_startup_trials=n))
    plain.optimize(objective, n_trials=n)
    assert agreement_with_prior(study) > 0.8  # 0.9 expected
    assert 0.3 < agreement_with_prior(plain) < 0.7  # 0.5 expected
    with_prior.set_prior(None)  # removed: the next start-up draws are uniform again
    again = optuna.create_study(sampler=with_prior)
    again.optimize(objective, n_trials=n)
    assert 0.3 < agreement_with_prior(again) < 0.7


@pytest.mark.parametrize("sampler_class", [TPESampler, DiscreteGPSampler], ids=["tpe", "gp"])
def test_a_choice_scored_zero_is_never_drawn_from_then_on(sampler_class) -> None:
    def mixed(trial: optuna.Trial) -> float:
        mode = trial.suggest_categorical("mode", ["a", "b", "c"])
        return objective(trial) + (mode != "a")  # "a" is the best choice

    sampler = sampler_class(seed=0, n_startup_trials=5)
    study = optuna.create_study(sampler=sampler)
    study.optimize(mixed, n_trials=20)
    assert "a" in {t.params["mode"] for t in study.trials[10:]}  # the model found the best choice
    sampler.set_prior({"mode": {"a": 0.0}, "l0": {"fp32": 0.0}})  # start-up draws and the model alike
    study.optimize(mixed, n_trials=30)
    later = study.trials[20:]
    assert {t.params["mode"] for t in later} == {"b", "c"}
    assert {t.params["l0"] for t in later} == {"int8"}
    with pytest.raises(ValueError, match="every choice of parameter 'mode' 0"):
        sampler.set_prior({"mode": {"a": 0.0, "b": 0.0, "c": 0.0}})
        study.optimize(mixed, n_trials=1, catch=())


@pytest.mark.parametrize(
    "make_sampler",
    [lambda: TPESampler(seed=0, n_startup_trials=5), lambda: TPESampler.pot(seed=0), lambda: DiscreteGPSampler(seed=0, n_startup_trials=5)],
    ids=["tpe", "tpe-pot", "gp"],
)
def test_a_forbidden_pair_is_never_drawn_from_then_on_and_either_choice_alone_still_is(make_sampler) -> None:
    # The pair is the optimum's own l0 and l1: the models want both, and may have only one.
    pair = {"l0": GOOD["l0"], "l1": GOOD["l1"]}
    sampler = make_sampler()
    study = optuna.create_study(sampler=sampler)
    study.optimize(objective, n_trials=20)
    assert any(all(t.params[k] == v for k, v in pair.items()) for t in study.trials)
    sampler.set_forbidden([pair, {"l2": "fp32", "not_a_parameter": 1}])  # the second forbids nothing
    study.optimize(objective, n_trials=40)
    later = study.trials[20:]
    assert not any(all(t.params[k] == v for k, v in pair.items()) for t in later)
    assert {t.params["l0"] for t in later} == {t.params["l1"] for t in later} == {"int8", "fp32"}
    assert "fp32" in {t.params["l2"] for t in later}
    assert len({tuple(sorted(t.params.items())) for t in study.trials}) == 60  # never a repeat
    with pytest.raises(TypeError, match="A forbidden combination maps parameters to choices, got"):
        sampler.set_forbidden([("l0", "int8")])


def median_trials_to_optimum(sampler_class, prior, budget: int) -> float:
    """The median over seeds 0-2 of the trials a study needs to reach :func:`objective`'s 0."""
    counts = []
    for seed in range(3):
        study = optuna.create_study(sampler=sampler_class(seed=seed, prior=prior))
        study.optimize(objective, n_trials=budget, callbacks=[lambda s, t: s.stop() if t.value == 0 else None])
        counts.append(len(study.trials))
    return float(np.median(counts))


@pytest.mark.parametrize("sampler_class", [TPESampler, DiscreteGPSampler], ids=["tpe", "gp"])
def test_a_right_prior_finds_the_optimum_sooner(sampler_class) -> None:
    with_prior, without = (median_trials_to_optimum(sampler_class, prior, 60) for prior in (PRIOR, None))
    assert with_prior < 0.5 * without, (with_prior, without)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="prior_strength must not be negative, got -1"):
        DiscreteGPSampler(prior_strength=-1)
    for sampler_class in (TPESampler, DiscreteGPSampler):
        with pytest.raises(ValueError, match="claim_wait_seconds must not be negative, got -0.5"):
            sampler_class(claim_wait_seconds=-0.5)


def test_a_prior_the_trials_contradict_flattens_and_one_they_bear_out_stands() -> None:
    space = DiscreteSpace({name: CategoricalDistribution(["int8", "fp32"]) for name in ("right", "wrong")})
    prior = SpacePrior(space, {"right": {"int8": 0.9, "fp32": 0.1}, "wrong": {"int8": 0.9, "fp32": 0.1}})
    # The trials that did best kept "right" int8 and put "wrong" in fp32.
    configs = np.array([[0, 1], [0, 1], [1, 1], [0, 0], [1, 0], [1, 0]])
    order = np.arange(len(configs))  # best first
    following = prior.following(configs, order)
    assert following.probs[0].tolist() == prior.probs[0].tolist()
    assert following.probs[1][0] < 0.6 < prior.probs[1][0]
    # Too few trials to say anything: the prior stands.
    assert prior.following(configs[:3], order[:3]).probs[1].tolist() == prior.probs[1].tolist()


@pytest.mark.parametrize("sampler_class", [TPESampler, DiscreteGPSampler], ids=["tpe", "gp"])
def test_a_wrong_prior_costs_a_few_trials_not_the_study(sampler_class) -> None:
    wrong = {name: {GOOD[name]: 0.05, ("int8" if GOOD[name] == "fp32" else "fp32"): 0.95} for name in LAYERS}

    # With piBO's fixed schedule alone, the GP took 22 trials on each of seeds 0-5, against 13.
    misled, without = (median_trials_to_optimum(sampler_class, prior, 100) for prior in (wrong, None))
    assert misled <= 2 * without, (misled, without)
