"""One Optuna trial: the search space, the objective, the records it stores, and what guides it.

:mod:`.space` is the Optuna search space, :mod:`.objective` the objective that measures a trial
through :class:`optuna_quant.measure.measurer.Measurer`, :mod:`.records` the schema of what a
study stores, :mod:`.reference` and :mod:`.guidance` the once-per-study measurements.
"""
