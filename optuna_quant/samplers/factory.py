"""Samplers by name, as ``create_study(sampler=...)`` and the config file give them."""

from __future__ import annotations

import optuna

from optuna_quant.samplers._gp import DiscreteGPSampler
from optuna_quant.samplers._tpe import TPESampler


SAMPLER_NAMES = ("tpe", "gp", "random")
DEFAULT_SAMPLER = "gp"
"""The sampler a study gets when none is named (docs/benchmarks.md, "Time to quality")."""


def make_sampler(sampler: str | optuna.samplers.BaseSampler, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The sampler named ``sampler`` (``"tpe"``, ``"gp"``, ``"random"``), or ``sampler`` itself.

    Raises:
        ValueError: For an unknown name.
        TypeError: For something that is neither a name nor a sampler.

    Example:
        >>> type(make_sampler("random", seed=0)).__name__
        'RandomSampler'
    """
    if isinstance(sampler, optuna.samplers.BaseSampler):
        return sampler
    if not isinstance(sampler, str):
        raise TypeError(f"sampler must be a name {SAMPLER_NAMES} or an Optuna sampler, got {sampler!r}.")
    if sampler == "tpe":
        return TPESampler(seed=seed)
    if sampler == "gp":
        return DiscreteGPSampler(seed=seed)
    if sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"Unknown sampler {sampler!r}; choose from {SAMPLER_NAMES} or pass an Optuna sampler.")
