"""Variants of optuna-quant's TPE used only by the TPE section of ``docs/benchmarks.md``.

Name them as ``--sampler benchmarks.tpe_variants:indep`` in ``benchmarks/bench_samplers.py``.
"""

from __future__ import annotations

from optuna_quant._optuna_private import cached_trials
from optuna_quant.samplers import TPESampler


def indep(seed: int) -> TPESampler:
    """The default settings with one independent model per parameter."""
    return TPESampler(seed=seed, multivariate=False)


class _Repeats(TPESampler):
    def sample_relative(self, study, trial, search_space):  # type: ignore[no-untyped-def]
        if not search_space:
            return {}
        return self._sample(study, cached_trials(study), search_space, never_repeat=False)


def potrep(seed: int) -> TPESampler:
    """The POT preset without the never-repeat rule: how faithful the port is to hyperopt."""
    sampler = TPESampler.pot(seed=seed)
    sampler.__class__ = _Repeats
    return sampler


def startup5(seed: int) -> TPESampler:
    """Five start-up trials instead of ten: with a prior, the start-up draws already follow it."""
    return TPESampler(seed=seed, n_startup_trials=5)


class _NoStartupQueue(TPESampler):
    max_startup_trials = 0


def no_startup_queue(seed: int) -> TPESampler:
    """The default sampler without an optuna-quant study's start-up trials, as the GP
    (``bench_samplers --live-queue``)."""
    return _NoStartupQueue(seed=seed)
