"""INC's module name (``neural_compressor.strategy.bayesian``), kept for code that imports it:
the same names as :mod:`optuna_quant.samplers.gp`."""

from __future__ import annotations

from optuna_quant.samplers.gp import *  # noqa: F401,F403
from optuna_quant.samplers.gp import __all__  # noqa: F401
