"""TPE after Bergstra et al. (2011), one job per module as Optuna's ``samplers/_tpe``: the sampler
orchestrates (:mod:`.sampler`), the Parzen estimators model (:mod:`.parzen_estimator`) on the
parameters and kernels of :mod:`.probability_distributions` (with :mod:`.truncnorm`'s normal
mass), :mod:`.candidates` chooses among the drawn candidates, and :mod:`.search_space` converts
between a finite space's configurations and the estimators' values."""

from __future__ import annotations

from optuna_quant.samplers._tpe.sampler import TPESampler


__all__ = ["TPESampler"]
