"""The pieces of :mod:`optuna_quant.samplers.gp`, one job per module, as Optuna's ``optuna._gp``."""
