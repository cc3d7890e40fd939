"""Variants of optuna-quant's GP sampler used only by the sampler sections of ``docs/benchmarks.md``.

Name them as ``--sampler benchmarks.gp_variants:two_startup`` in ``benchmarks/bench_samplers.py``.
"""

from __future__ import annotations

from optuna_quant.samplers import DiscreteGPSampler


def two_startup(seed: int) -> DiscreteGPSampler:
    """The former default: two random start-up trials instead of one."""
    return DiscreteGPSampler(seed=seed, n_startup_trials=2)


def prior_strength_1(seed: int) -> DiscreteGPSampler:
    """The prior's piBO weight ``beta`` at 1 instead of 10: a prior that fades ten times sooner."""
    return DiscreteGPSampler(seed=seed, prior_strength=1.0)


def prior_strength_3(seed: int) -> DiscreteGPSampler:
    """The prior's piBO weight ``beta`` at 3 instead of 10."""
    return DiscreteGPSampler(seed=seed, prior_strength=3.0)


class _StartupQueued(DiscreteGPSampler):
    max_startup_trials = None


def startup_queue(seed: int) -> DiscreteGPSampler:
    """The default sampler with the whole of an optuna-quant study's start-up queue before it, as
    the TPE gets it (``bench_samplers --live-queue``)."""
    return _StartupQueued(seed=seed)


class _BaseStartup(DiscreteGPSampler):
    max_startup_trials = 1


def base_startup(seed: int) -> DiscreteGPSampler:
    """The default sampler with the first of an optuna-quant study's start-up trials queued
    before it: the base combination of the other scopes with every layer int8
    (``bench_samplers --live-queue``)."""
    return _BaseStartup(seed=seed)
