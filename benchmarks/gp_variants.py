"""Variants of optuna-quant's GP sampler used only by the GP section of ``docs/benchmarks.md``.

Name them as ``--sampler benchmarks.gp_variants:two_startup`` in ``benchmarks/bench_samplers.py``.
"""

from __future__ import annotations

from optuna_quant.samplers import DiscreteGPSampler


def two_startup(seed: int) -> DiscreteGPSampler:
    """The former default: two random start-up trials instead of one."""
    return DiscreteGPSampler(seed=seed, n_startup_trials=2)
