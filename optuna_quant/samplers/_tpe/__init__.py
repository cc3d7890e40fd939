"""TPE after Bergstra et al. (2011), as Optuna's ``samplers/_tpe``: the sampler orchestrates
(:mod:`.sampler`), the Parzen estimators compute (:mod:`.parzen_estimator`)."""

from __future__ import annotations

from optuna_quant.samplers._tpe.sampler import TPESampler

__all__ = ["TPESampler"]
