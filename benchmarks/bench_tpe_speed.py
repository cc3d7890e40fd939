"""Sampler time per trial of optuna-quant's TPESampler on a 30-parameter categorical space.

The space has the shape of a large quantization study: 26 binary parameters (one int8/fp32 switch
per layer) and four 5-way ones. The objective is a cheap additive function with noise, so that
the study's good and bad sets keep changing. Only the time spent inside the sampler's methods is
counted (``infer_relative_search_space``, ``sample_relative``, ``sample_independent``), not
Optuna's own bookkeeping nor the objective.

Example:
    .venv/bin/python -m benchmarks.bench_tpe_speed --trials 200 --repeats 3
"""

from __future__ import annotations

import os


# One thread: the machine is shared, and the bar is per process.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
from collections.abc import Callable  # noqa: E402
from collections.abc import Sequence  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import optuna  # noqa: E402

from optuna_quant.samplers import TPESampler  # noqa: E402


N_BINARY = 26
N_FIVE_WAY = 4


class TimedSampler(TPESampler):
    """A :class:`TPESampler` that adds up the time spent in its sampling methods, per trial.

    Both clocks are kept: wall time is what a study waits for, CPU time of the process is what
    the sampler costs when other processes share the machine.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.wall: dict[int, float] = {}
        self.cpu: dict[int, float] = {}

    def _timed(self, method: Callable[..., Any], trial: optuna.trial.FrozenTrial, *args: Any) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            return method(*args)
        finally:
            n = trial.number
            self.wall[n] = self.wall.get(n, 0.0) + time.perf_counter() - wall
            self.cpu[n] = self.cpu.get(n, 0.0) + time.process_time() - cpu

    def infer_relative_search_space(self, study, trial):  # type: ignore[no-untyped-def]
        return self._timed(super().infer_relative_search_space, trial, study, trial)

    def sample_relative(self, study, trial, search_space):  # type: ignore[no-untyped-def]
        return self._timed(super().sample_relative, trial, study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):  # type: ignore[no-untyped-def]
        return self._timed(super().sample_independent, trial, study, trial, param_name, param_distribution)


def objective(trial: optuna.Trial, weights: np.ndarray, rng: np.random.RandomState) -> float:
    """An additive function of the choice indices, with noise."""
    binary = [trial.suggest_categorical(f"layer_{i:02d}", ["int8", "fp32"]) == "fp32" for i in range(N_BINARY)]
    five = [
        trial.suggest_categorical(f"scope_{i}", ["a", "b", "c", "d", "e"]) for i in range(N_FIVE_WAY)
    ]
    x = np.array(binary + ["abcde".index(v) / 4 for v in five], dtype=float)
    return float(weights @ x + 0.1 * rng.normal())


def run(trials: int, seed: int, multivariate: bool) -> tuple[np.ndarray, np.ndarray]:
    """Sampler milliseconds of each trial of one study: wall time and CPU time."""
    sampler = TimedSampler(seed=seed, multivariate=multivariate)
    study = optuna.create_study(sampler=sampler)
    rng = np.random.RandomState(seed)
    weights = rng.normal(size=N_BINARY + N_FIVE_WAY)
    study.optimize(functools.partial(objective, weights=weights, rng=rng), n_trials=trials)
    wall = np.array([sampler.wall.get(i, 0.0) for i in range(trials)])
    cpu = np.array([sampler.cpu.get(i, 0.0) for i in range(trials)])
    return 1000.0 * wall, 1000.0 * cpu


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3, help="studies per mode, seeds 0, 1, ...")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Print the sampler's milliseconds per trial: over the study, and over its last 20 trials."""
    args = parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print(f"{N_BINARY} binary + {N_FIVE_WAY} 5-way categorical parameters, {args.trials} trials")
    for multivariate in (True, False):
        runs = [run(args.trials, seed, multivariate) for seed in range(args.repeats)]
        mode = "multivariate" if multivariate else "independent"
        for clock, ms in zip(("wall", "CPU"), (np.stack(r) for r in zip(*runs))):
            print(
                f"{mode:>12} {clock:>4}: {ms.mean():.2f} ms per trial over the study, "
                f"{ms[:, -20:].mean():.2f} ms over trials {args.trials - 19}-{args.trials}, "
                f"slowest trial {ms.max():.1f} ms"
            )


if __name__ == "__main__":
    main()
