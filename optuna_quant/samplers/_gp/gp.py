"""A Gaussian process on a product of finite choice lists.

Configurations are rows of choice indices. Each dimension is either *categorical* (two values are
equal or not) or *ordinal* (integer and stepped-float parameters, whose index distance means
something). Per dimension ``j`` the distance of two configurations is

- ``delta_j = [x_j != y_j]`` for a categorical dimension,
- ``delta_j = |x_j - y_j| / (n_j - 1)`` for an ordinal one (``n_j`` choices),

and the kernel is the sum of a product (Hamming) part and an additive (overlap) part::

    k(x, y) = s * exp(-sum_j theta_j * delta_j) + sum_j w_j * (1 - delta_j)

The product part captures interactions between parameters, the additive part one main effect
per parameter (a ridge regression on one-hot features), which is what post-training quantization
mostly looks like: each layer adds its own share of accuracy loss and of speed-up. Both parts are
positive definite (an exponentiated Hamming distance; an overlap kernel, and a triangle kernel for
ordinal dimensions). ``theta``, ``w``, ``s`` and the noise variance are fitted by maximising the
marginal likelihood with weak log-normal priors, with analytic gradients and L-BFGS-B on the
log-parameters, warm-started from the previous fit.

Distances to many candidates are computed as matrix products: every dimension is encoded as
binary features (one-hot for a categorical dimension, a thermometer code for an ordinal one), so
that a weighted sum of ``delta_j`` is a weighted squared distance between binary vectors.
"""

from __future__ import annotations

from collections.abc import Sequence
import math

import numpy as np
import scipy.linalg
import scipy.optimize


_LOG_2PI = math.log(2.0 * math.pi)
# Bounds of the log-hyperparameters: beyond them the likelihood is flat or the matrix singular.
_LOG_THETA_BOUNDS = (math.log(1e-4), math.log(20.0))
_LOG_WEIGHT_BOUNDS = (math.log(1e-6), math.log(10.0))
_LOG_SCALE_BOUNDS = (math.log(1e-4), math.log(10.0))
_LOG_NOISE_BOUNDS = (math.log(1e-6), math.log(1.0))
_JITTER = 1e-9
_ALWAYS_REFIT_BELOW = 30
_REFIT_GROWTH = 1.2


class DiscreteGP:
    """Gaussian-process regression on index-encoded configurations.

    The targets are standardised inside; :meth:`predict` answers in the caller's units.

    Args:
        n_choices: The number of choices of each dimension.
        ordinal: Which dimensions are ordinal (index distance is meaningful); by default none.
        max_iter: L-BFGS-B iterations of a fit that starts from scratch; a warm-started fit, which
            starts near its optimum, gets a sixth of them.

    Example:
        >>> import numpy as np
        >>> X = np.array([[0, 0], [0, 1], [1, 0], [1, 1], [2, 0]])
        >>> y = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
        >>> gp = DiscreteGP([3, 2]).fit(X, y)
        >>> mean, std = gp.predict(np.array([[2, 1]]), return_std=True)
        >>> bool(mean[0] > 3.0)
        True
    """

    def __init__(
        self, n_choices: Sequence[int], ordinal: Sequence[bool] | None = None, max_iter: int = 150
    ) -> None:
        self.n_choices = np.asarray(n_choices, dtype=np.int64)
        self.dim = len(self.n_choices)
        ordinal_mask = np.zeros(self.dim, bool) if ordinal is None else np.asarray(ordinal, bool)
        # An ordinal dimension of two values is a categorical one.
        self.ordinal = ordinal_mask & (self.n_choices > 2)
        self.max_iter = max_iter
        self._encoding = _BinaryEncoding(self.n_choices, self.ordinal)
        self._log_params: np.ndarray | None = None
        self._n_fitted = 0
        self.X = np.empty((0, self.dim), dtype=np.int64)

    @property
    def theta(self) -> np.ndarray:
        """Inverse lengthscales of the product part, one per dimension."""
        return np.exp(self._params()[: self.dim])

    @property
    def weights(self) -> np.ndarray:
        """Variances of the additive part, one per dimension."""
        return np.exp(self._params()[self.dim : 2 * self.dim])

    @property
    def noise(self) -> float:
        """The fitted noise variance, in standardised units."""
        return float(np.exp(self._params()[-1]))

    @property
    def log_params(self) -> np.ndarray:
        """Every hyperparameter, in logs: ``theta``, ``weights``, the product part's variance and
        the noise variance."""
        return self._params().copy()

    def log_marginal_likelihood(self, log_params: np.ndarray | None = None) -> float:
        """The log marginal likelihood of the fitted data under ``log_params`` (by default the
        fitted ones), without the hyperparameters' prior; named as scikit-learn's.

        Example:
            >>> import numpy as np
            >>> X = np.array([[0, 0], [0, 1], [1, 0], [1, 1], [2, 0]])
            >>> gp = DiscreteGP([3, 2]).fit(X, np.array([0.0, 1.0, 2.0, 3.0, 4.0]))
            >>> bool(gp.log_marginal_likelihood() > gp.log_marginal_likelihood(gp.log_params + 3.0))
            True
        """
        log_params = self._params() if log_params is None else np.asarray(log_params, dtype=float)
        z = (self._y - self._y_mean) / self._y_std
        neg_log_posterior, _ = self._neg_log_posterior(log_params, self._pair_deltas(self.X), z)
        return -(neg_log_posterior + self._log_prior(log_params)[0])

    def fit(self, X: np.ndarray, y: np.ndarray, optimize: bool | None = None) -> DiscreteGP:
        """Fit the GP to configurations ``X`` (``(n, dim)`` indices) and targets ``y``.

        Args:
            X: Training configurations.
            y: Their targets, finite.
            optimize: Whether to fit the hyperparameters; ``False`` keeps the last ones and only
                conditions on the new data (cheap). By default they are fitted while there are
                few points, and then each time the data have grown by a fifth since the last fit:
                one more point barely moves them, and refitting costs far more than conditioning.
                Data of the size last fitted are taken to be the same data and not refitted.

        Returns:
            ``self``.
        """
        X = np.asarray(X, dtype=np.int64).reshape(-1, self.dim)
        y = np.asarray(y, dtype=float)
        self._y_mean = float(np.mean(y)) if len(y) else 0.0
        std = float(np.std(y)) if len(y) else 1.0
        self._y_std = std if std > 1e-12 else 1.0
        z = (y - self._y_mean) / self._y_std
        if optimize is None:
            # A study's data only grow, so data of the size last fitted are the same data: a
            # sampler that chooses again after a clash with another worker reuses the fit.
            optimize = len(y) != self._n_fitted and (
                self._n_fitted == 0
                or len(y) <= _ALWAYS_REFIT_BELOW
                or len(y) >= _REFIT_GROWTH * self._n_fitted
            )
        if optimize and len(y) >= 2:
            self._log_params = self._optimize(self._pair_deltas(X), z)
            self._n_fitted = len(y)
        self._condition(X, z)
        return self

    def predict(
        self, X: np.ndarray, return_std: bool = False
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Posterior mean (and standard deviation) of the latent function at ``X``.

        The signature follows scikit-learn's ``GaussianProcessRegressor.predict``, which INC's
        acquisition functions call.
        """
        X = np.asarray(X, dtype=np.int64).reshape(-1, self.dim)
        k_star = self._cross_kernel(X)
        mean = self._y_mean + self._y_std * (k_star @ self._alpha)
        if not return_std:
            return mean
        prior_var = self._scale + float(np.sum(self._weights))
        var = prior_var - np.einsum("ij,ij->i", k_star @ self._K_inv, k_star)
        return mean, self._y_std * np.sqrt(np.maximum(var, 1e-12))

    def with_pending(self, X_pending: np.ndarray) -> DiscreteGP:
        """A copy that also believes its own mean at ``X_pending`` (the kriging believer).

        Configurations being evaluated by other workers then have a small posterior variance, so
        the acquisition looks elsewhere; the hyperparameters stay as they are.
        """
        X_pending = np.asarray(X_pending, dtype=np.int64).reshape(-1, self.dim)
        if len(X_pending) == 0:
            return self
        believed = np.asarray(self.predict(X_pending))
        other = DiscreteGP.__new__(DiscreteGP)
        other.__dict__.update(self.__dict__)
        X = np.vstack([self.X, X_pending])
        z = (np.concatenate([self._y, believed]) - self._y_mean) / self._y_std
        other._condition(X, z)
        return other

    # -- internals -------------------------------------------------------------------------

    def _params(self) -> np.ndarray:
        if self._log_params is None:
            self._log_params = self._default_params()
        return self._log_params

    def _default_params(self) -> np.ndarray:
        d = self.dim
        return np.concatenate(
            [np.full(d, -math.log(d)), np.full(d, -math.log(d)), [0.0], [math.log(1e-2)]]
        )

    def _bounds(self) -> list[tuple[float, float]]:
        d = self.dim
        return (
            [_LOG_THETA_BOUNDS] * d
            + [_LOG_WEIGHT_BOUNDS] * d
            + [_LOG_SCALE_BOUNDS, _LOG_NOISE_BOUNDS]
        )

    def _pair_deltas(self, X: np.ndarray) -> np.ndarray:
        """``delta_j`` of every pair ``(a, b)``, as an ``(n, n, dim)`` array."""
        deltas = (X[:, None, :] != X[None, :, :]).astype(float)
        if self.ordinal.any():
            cols = np.flatnonzero(self.ordinal)
            diff = np.abs(X[:, None, cols] - X[None, :, cols])
            deltas[:, :, cols] = diff / (self.n_choices[cols] - 1)
        return deltas

    def _neg_log_posterior(
        self, log_params: np.ndarray, deltas: np.ndarray, z: np.ndarray
    ) -> tuple[float, np.ndarray]:
        d, n = self.dim, len(z)
        flat = deltas.reshape(n * n, d)  # matrix-vector products beat einsum here
        theta = np.exp(log_params[:d])
        weights = np.exp(log_params[d : 2 * d])
        scale, noise = np.exp(log_params[2 * d]), np.exp(log_params[2 * d + 1])
        k_prod = np.exp(-(flat @ theta)).reshape(n, n)
        K = scale * k_prod + (np.sum(weights) - flat @ weights).reshape(n, n)
        K[np.diag_indices(n)] += noise + _JITTER
        try:
            chol = scipy.linalg.cho_factor(K, lower=True, check_finite=False)
        except np.linalg.LinAlgError:
            return 1e25, np.zeros_like(log_params)
        alpha = scipy.linalg.cho_solve(chol, z, check_finite=False)
        K_inv = scipy.linalg.cho_solve(chol, np.eye(n), check_finite=False)
        nll = 0.5 * z @ alpha + np.sum(np.log(np.diag(chol[0]))) + 0.5 * n * _LOG_2PI
        # d nll / d param = -0.5 * tr(W dK/dparam), with W = alpha alpha^T - K^-1.
        W = np.outer(alpha, alpha) - K_inv
        W_k_prod = W * k_prod
        grad = np.empty_like(log_params)
        grad[:d] = 0.5 * scale * theta * (W_k_prod.ravel() @ flat)
        grad[d : 2 * d] = -0.5 * weights * (np.sum(W) - W.ravel() @ flat)
        grad[2 * d] = -0.5 * scale * np.sum(W_k_prod)
        grad[2 * d + 1] = -0.5 * noise * np.trace(W)
        prior, prior_grad = self._log_prior(log_params)
        return float(nll - prior), grad - prior_grad

    def _log_prior(self, log_params: np.ndarray) -> tuple[float, np.ndarray]:
        # Weak log-normal priors: centred on a kernel where each parameter explains 1/d of the
        # variance, wide enough for the data to overrule them after a few trials.
        d = self.dim
        centre = self._default_params()
        spread = np.concatenate([np.full(2 * d, 2.0), [1.5, 2.0]])
        u = (log_params - centre) / spread
        return float(-0.5 * np.sum(u**2)), -u / spread

    def _optimize(self, deltas: np.ndarray, z: np.ndarray) -> np.ndarray:
        # Warm-start from the last fit; while the data are few, the likelihood is flat and
        # multimodal, so the default start competes too (a restart that costs little then).
        starts = [(self._default_params(), self.max_iter)]
        if self._log_params is not None:
            warm = (self._log_params, max(10, self.max_iter // 6))
            starts = [warm] + (starts if len(z) <= _ALWAYS_REFIT_BELOW else [])
        bounds = self._bounds()
        low, high = np.array(bounds).T
        best_x, best_f = starts[0][0], math.inf
        for x0, max_iter in starts:
            res = scipy.optimize.minimize(
                self._neg_log_posterior,
                np.clip(x0, low, high),
                args=(deltas, z),
                jac=True,
                method="L-BFGS-B",
                bounds=bounds,
                options={"maxiter": max_iter},
            )
            if res.fun < best_f:
                best_x, best_f = res.x, float(res.fun)
        return best_x

    def _condition(self, X: np.ndarray, z: np.ndarray) -> None:
        d = self.dim
        params = self._params()
        self._theta, self._weights = np.exp(params[:d]), np.exp(params[d : 2 * d])
        self._scale, noise = float(np.exp(params[2 * d])), float(np.exp(params[2 * d + 1]))
        self.X = X
        self._per_dim = np.stack([self._theta, self._weights])
        self._train_codes = self._encoding.weighted(X, self._per_dim)
        K = self._cross_kernel(X)
        K[np.diag_indices(len(X))] += noise + _JITTER
        chol = scipy.linalg.cho_factor(K, lower=True, check_finite=False)
        self._y = self._y_mean + self._y_std * z
        self._alpha = scipy.linalg.cho_solve(chol, z, check_finite=False)
        self._K_inv = scipy.linalg.cho_solve(chol, np.eye(len(X)), check_finite=False)

    def _cross_kernel(self, X: np.ndarray) -> np.ndarray:
        """``k(X, self.X)`` as an ``(m, n)`` array, through the binary encoding."""
        dist_theta, dist_weights = self._encoding.distances(X, self._train_codes, self._per_dim)
        return self._scale * np.exp(-dist_theta) + (np.sum(self._weights) - dist_weights)


class _BinaryEncoding:
    """Binary features whose weighted squared distance is ``sum_j v_j * delta_j``.

    A categorical dimension of ``n`` choices is one-hot (two features differ when the values do,
    hence a factor 1/2); an ordinal one is a thermometer code of ``n - 1`` features (``|i - k|``
    of them differ, hence a factor ``1 / (n - 1)``). A binary dimension, either way, is one bit.
    """

    def __init__(self, n_choices: np.ndarray, ordinal: np.ndarray) -> None:
        groups, levels, is_ordinal, factors = [], [], [], []
        thermometer = ordinal | (n_choices == 2)
        for j, (n, ordinal_j) in enumerate(zip(n_choices.tolist(), thermometer.tolist())):
            width = n - 1 if ordinal_j else n
            groups += [j] * width
            levels += list(range(width))
            is_ordinal += [ordinal_j] * width
            factors += [1.0 / (n - 1) if ordinal_j else 0.5] * width
        self._groups = np.array(groups, dtype=np.int64)
        self._levels = np.array(levels, dtype=np.int64)
        self._is_ordinal = np.array(is_ordinal, dtype=bool)
        self._factors = np.array(factors)

    def encode(self, X: np.ndarray) -> np.ndarray:
        """The binary features of configurations ``X``, ``(m, width)``."""
        values = X[:, self._groups]
        # One-hot: value == level; thermometer: value > level.
        codes = np.where(self._is_ordinal, values > self._levels, values == self._levels)
        return codes.astype(float)

    def weighted(self, X: np.ndarray, per_dim: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each row of ``per_dim`` (``(k, dim)``): the features of ``X`` scaled by it, stacked
        as ``(k * m, width)``, and their squared norms ``(k, m)``; :meth:`distances` takes them."""
        feature_weights = per_dim[:, self._groups] * self._factors  # (k, width)
        Z = self.encode(X)
        scaled = (Z[None, :, :] * feature_weights[:, None, :]).reshape(-1, Z.shape[1])
        return scaled, feature_weights @ Z.T

    def distances(
        self, X: np.ndarray, train: tuple[np.ndarray, np.ndarray], per_dim: np.ndarray
    ) -> np.ndarray:
        """``sum_j per_dim[r, j] * delta_j(x, t)`` for every row ``r`` of ``per_dim``, every ``x``
        in ``X`` and every training ``t`` (as given by :meth:`weighted`): ``(k, m, n)``."""
        train_scaled, train_norms = train
        Z = self.encode(X)
        k, n = train_norms.shape
        norms = (per_dim[:, self._groups] * self._factors) @ Z.T  # (k, m)
        # Binary features: (a - b)^2 = a + b - 2ab; one product for all k weightings.
        cross = (Z @ train_scaled.T).reshape(len(X), k, n).transpose(1, 0, 2)
        return np.maximum(norms[:, :, None] + train_norms[:, None, :] - 2.0 * cross, 0.0)
