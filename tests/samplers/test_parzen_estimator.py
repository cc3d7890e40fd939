"""The Parzen estimators of the TPE sampler against densities computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optuna_quant.samplers._tpe.parzen_estimator import gaussian_kernels
from optuna_quant.samplers._tpe.parzen_estimator import linear_forgetting_weights
from optuna_quant.samplers._tpe.parzen_estimator import MultivariateParzen
from optuna_quant.samplers._tpe.parzen_estimator import UnivariateParzen
from optuna_quant.samplers._tpe.probability_distributions import CategoricalDim
from optuna_quant.samplers._tpe.probability_distributions import NumericDim
from optuna_quant.samplers._tpe.truncnorm import log_gauss_mass


def phi(z: float) -> float:
    return math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def cdf(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def truncated_pdf(x: float, mu: float, sigma: float, low: float, high: float) -> float:
    return phi((x - mu) / sigma) / sigma / (cdf((high - mu) / sigma) - cdf((low - mu) / sigma))


def cell_mass(left: float, right: float, mu: float, sigma: float, low: float, high: float) -> float:
    inside = cdf((high - mu) / sigma) - cdf((low - mu) / sigma)
    return (cdf((right - mu) / sigma) - cdf((left - mu) / sigma)) / inside


def test_categorical_counts_plus_prior_pseudo_counts() -> None:
    # Choice counts (2, 1, 0) plus 0.5 per choice: (2.5, 1.5, 0.5) / 4.5.
    est = UnivariateParzen(np.array([[0], [1], [0]]), [CategoricalDim(3)], np.ones(3), 0.5)
    p = np.exp(est.log_pdf(np.array([[0], [1], [2]])))[:, 0]
    np.testing.assert_allclose(p, [2.5 / 4.5, 1.5 / 4.5, 0.5 / 4.5])


def test_categorical_counts_are_weighted() -> None:
    # Weights 0.25 and 1: counts (0.25, 1) plus 1 each: (1.25, 2) / 3.25.
    est = UnivariateParzen(np.array([[0], [1]]), [CategoricalDim(2)], np.array([0.25, 1.0]), 1.0)
    np.testing.assert_allclose(np.exp(est.log_pdf(np.array([[0]])))[0, 0], 1.25 / 3.25)


def test_categorical_parameters_of_different_sizes_are_independent() -> None:
    dims = [CategoricalDim(2), CategoricalDim(4)]
    est = UnivariateParzen(np.array([[1, 3]]), dims, np.ones(1), 1.0)
    p = np.exp(est.log_pdf(np.array([[1, 3], [0, 0]])))
    np.testing.assert_allclose(p, [[2 / 3, 2 / 5], [1 / 3, 1 / 5]])


def test_linear_forgetting_ramps_the_oldest() -> None:
    w = linear_forgetting_weights(30)
    np.testing.assert_allclose(w[:5], np.linspace(1 / 30, 1, 5))
    np.testing.assert_array_equal(w[5:], np.ones(25))
    np.testing.assert_array_equal(linear_forgetting_weights(25), np.ones(25))


def test_bandwidths_by_hand() -> None:
    # Range [0, 10]: the prior sits at 5 with width 10. Sorted with the prior: 2, 3, (5), 8.
    # 2: distance to its only neighbour, 1; 3: max(1, 2) = 2; 8: distance to the prior, 3.
    # Clipped below at 10 / min(100, 3 + 2) = 2: (2, 2, 3), and 10 for the prior.
    mus, sigmas = gaussian_kernels(np.array([3.0, 8.0, 2.0]), NumericDim(0.0, 10.0, None, False))
    np.testing.assert_allclose(mus, [3.0, 8.0, 2.0, 5.0])
    np.testing.assert_allclose(sigmas, [2.0, 3.0, 2.0, 10.0])


def test_bandwidth_of_a_lone_observation_is_half_the_range() -> None:
    mus, sigmas = gaussian_kernels(np.array([1.0]), NumericDim(0.0, 4.0, None, False))
    np.testing.assert_allclose(sigmas, [2.0, 4.0])


def test_bandwidths_have_a_floor() -> None:
    # Equal observations have zero gaps; the floor is 10 / min(100, 3 + 2) = 2.
    _, sigmas = gaussian_kernels(np.array([4.0, 4.0, 4.0]), NumericDim(0.0, 10.0, None, False))
    np.testing.assert_allclose(sigmas, [2.0, 2.0, 2.0, 10.0])


def test_continuous_density_by_hand() -> None:
    dim = NumericDim(0.0, 10.0, None, False)
    est = UnivariateParzen(np.array([[3.0], [8.0], [2.0]]), [dim], np.ones(3), 1.0)
    kernels = [(3.0, 2.0), (8.0, 3.0), (2.0, 2.0), (5.0, 10.0)]
    for x in (0.5, 4.0, 9.9):
        expected = sum(truncated_pdf(x, mu, s, 0.0, 10.0) for mu, s in kernels) / 4
        np.testing.assert_allclose(np.exp(est.log_pdf(np.array([[x]])))[0, 0], expected, rtol=1e-6)


def test_integer_mass_by_hand() -> None:
    # IntDistribution(0, 4): kernels live on [-0.5, 4.5], width 5, prior at 2 with sigma 5; the lone
    # observation 1 gets sigma 2.5. The mass of 3 is that of the cell [2.5, 3.5].
    dim = NumericDim(0.0, 4.0, 1.0, False)
    est = UnivariateParzen(np.array([[1.0]]), [dim], np.ones(1), 1.0)
    expected = (
        0.5 * cell_mass(2.5, 3.5, 1.0, 2.5, -0.5, 4.5) + 0.5 * cell_mass(2.5, 3.5, 2.0, 5.0, -0.5, 4.5)
    )
    np.testing.assert_allclose(np.exp(est.log_pdf(np.array([[3.0]])))[0, 0], expected, rtol=1e-6)
    grid = np.arange(5.0)[:, None]
    np.testing.assert_allclose(np.exp(est.log_pdf(grid)).sum(), 1.0, rtol=1e-6)


def test_log_scale_density_integrates_to_one() -> None:
    dim = NumericDim(1e-3, 10.0, None, True)
    est = UnivariateParzen(np.array([[0.01], [0.5], [2.0]]), [dim], np.ones(3), 1.0)
    x = np.geomspace(1e-3, 10.0, 200_001)
    density = np.exp(est.log_pdf(x[:, None]))[:, 0]
    np.testing.assert_allclose(np.trapezoid(density, x), 1.0, rtol=1e-4)


def test_log_integer_mass_sums_to_one() -> None:
    dim = NumericDim(1.0, 64.0, 1.0, True)
    est = MultivariateParzen(np.array([[2.0], [40.0]]), [dim], np.ones(2), 1.0)
    grid = np.arange(1.0, 65.0)[:, None]
    np.testing.assert_allclose(np.exp(est.log_pdf(grid)).sum(), 1.0, rtol=1e-6)


def test_multivariate_categorical_by_hand() -> None:
    # Two observations: s = 1 / 3 pseudo-counts per choice in each kernel. On 2 choices a kernel
    # gives (1 + 1/3) / (1 + 2/3) = 0.8 to its choice and 0.2 to the other; the prior 0.5 each.
    # Mixture weights 1, 1 and the prior 1: a third each.
    dims = [CategoricalDim(2), CategoricalDim(2)]
    est = MultivariateParzen(np.array([[0, 0], [1, 1]]), dims, np.ones(2), 1.0)
    p = np.exp(est.log_pdf(np.array([[0, 0], [0, 1]])))
    np.testing.assert_allclose(p, [(0.64 + 0.04 + 0.25) / 3, (0.16 + 0.16 + 0.25) / 3])
    every = np.array([[a, b] for a in range(2) for b in range(2)])
    np.testing.assert_allclose(np.exp(est.log_pdf(every)).sum(), 1.0)


def test_multivariate_mixed_by_hand() -> None:
    # One categorical with 3 choices and one float on [0, 10]; one observation (2, 4.0), weight 1,
    # prior weight 0.5. s = 0.25: the kernel gives 1.25 / 1.75 to choice 2 and 0.25 / 1.75 to the
    # others. The float kernel at 4 has sigma 5 (half the range), the prior 10 at 5.
    dims = [CategoricalDim(3), NumericDim(0.0, 10.0, None, False)]
    est = MultivariateParzen(np.array([[2, 4.0]]), dims, np.ones(1), 0.5)
    x = 6.0
    kernel = truncated_pdf(x, 4.0, 5.0, 0.0, 10.0)
    prior = truncated_pdf(x, 5.0, 10.0, 0.0, 10.0)
    expected_2 = (2 / 3) * (1.25 / 1.75) * kernel + (1 / 3) * (1 / 3) * prior
    expected_0 = (2 / 3) * (0.25 / 1.75) * kernel + (1 / 3) * (1 / 3) * prior
    p = np.exp(est.log_pdf(np.array([[2, x], [0, x]])))
    np.testing.assert_allclose(p, [expected_2, expected_0], rtol=1e-6)


def test_sampling_follows_the_density() -> None:
    rng = np.random.RandomState(0)
    dims = [CategoricalDim(3), NumericDim(0.0, 4.0, 1.0, False)]
    observed = np.array([[0, 1.0], [0, 1.0], [2, 3.0]])
    for estimator in (UnivariateParzen, MultivariateParzen):
        est = estimator(observed, dims, np.ones(3), 1.0)
        draws = est.sample(rng, 40_000)
        assert set(np.unique(draws[:, 1])) <= {0.0, 1.0, 2.0, 3.0, 4.0}
        grid = np.array([[c, v] for c in range(3) for v in range(5)], dtype=float)
        if estimator is UnivariateParzen:
            expected = np.exp(est.log_pdf(grid).sum(axis=1))
        else:
            expected = np.exp(est.log_pdf(grid))
        counts = np.array([np.sum(np.all(draws == g, axis=1)) for g in grid]) / len(draws)
        np.testing.assert_allclose(counts, expected, atol=0.01)


def test_continuous_draws_stay_in_range() -> None:
    dim = NumericDim(-1.0, 1.0, None, False)
    est = UnivariateParzen(np.array([[-1.0], [1.0]]), [dim], np.ones(2), 1.0)
    draws = est.sample(np.random.RandomState(0), 5000)
    assert draws.min() >= -1.0 and draws.max() <= 1.0


def test_no_observations_is_the_prior() -> None:
    est = MultivariateParzen(np.empty((0, 1)), [CategoricalDim(4)], np.empty(0), 1.0)
    np.testing.assert_allclose(np.exp(est.log_pdf(np.arange(4)[:, None])), 0.25)


def test_prior_weight_must_be_positive() -> None:
    with pytest.raises(ValueError, match="prior_weight"):
        UnivariateParzen(np.empty((0, 1)), [CategoricalDim(2)], np.empty(0), 0.0)


@pytest.mark.parametrize("a, b", [(-1.0, 1.0), (0.5, 2.0), (-3.0, -2.5), (-0.2, 0.1), (4.0, 4.5)])
def test_log_gauss_mass_matches_erf(a: float, b: float) -> None:
    np.testing.assert_allclose(
        np.exp(log_gauss_mass(np.array(a), np.array(b))), cdf(b) - cdf(a), rtol=1e-6
    )


def test_log_gauss_mass_far_in_the_tail() -> None:
    # 1 - Phi(40) underflows to 0 in floating point; its log is about -804.608.
    value = log_gauss_mass(np.array([40.0, -41.0]), np.array([np.inf, -40.0]))
    np.testing.assert_allclose(value, [-804.6084420137539] * 2, rtol=1e-6)
