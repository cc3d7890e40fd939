"""Sampler time per trial of optuna-quant's DiscreteGPSampler and Optuna's GPSampler, side by side.

Both samplers run a study of ``--trials`` trials on the same 30-parameter categorical space (25
binary parameters and five 5-way ones, the shape of a layer-wise quantization space) in the same
process. The objective is a cheap synthetic function with two constraints set through
``trial.set_constraint``, as the quantization objective sets them; its own time is excluded. The
sampler time of a trial is the time from the end of one objective call to the end of the next,
less the objective's own time: what the sampler costs a study. It is measured both as the
process's CPU time (every thread; robust to other load on a shared machine) and as wall time.

Example:
    .venv/bin/python -m benchmarks.bench_gp_speed --trials 200 --seed 0
"""

from __future__ import annotations

import os


# One thread: the machine is shared, and a sampler's cost per trial is what is measured.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
from collections.abc import Callable  # noqa: E402
from collections.abc import Sequence  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import optuna  # noqa: E402

from benchmarks._versions import versions  # noqa: E402
from optuna_quant.samplers import DiscreteGPSampler  # noqa: E402


N_BINARY = 25
N_FIVE_WAY = 5


class SyntheticObjective:
    """An additive function with a few pairwise interactions and two constraints.

    Args:
        seed: Seed of the function's coefficients (fixed across samplers).
        constraints: Whether to set the two constraints.
    """

    def __init__(self, seed: int, constraints: bool = True) -> None:
        rng = np.random.RandomState(seed)
        self.names = [f"b{i:02d}" for i in range(N_BINARY)] + [f"c{i}" for i in range(N_FIVE_WAY)]
        self.choices = {name: [0, 1] for name in self.names[:N_BINARY]}
        self.choices.update({name: list(range(5)) for name in self.names[N_BINARY:]})
        self.main = {name: rng.normal(size=len(c)) for name, c in self.choices.items()}
        self.pairs = [tuple(rng.choice(len(self.names), 2, replace=False)) for _ in range(10)]
        self.constraints = constraints
        self.seconds = 0.0

    def __call__(self, trial: optuna.Trial) -> float:
        # Suggesting is the sampler's work (relative sampling runs on the first suggest).
        params = [trial.suggest_categorical(name, self.choices[name]) for name in self.names]
        start = time.perf_counter()
        value = sum(self.main[name][v] for name, v in zip(self.names, params))
        value += sum(1.5 * (params[i] == params[j]) for i, j in self.pairs)
        if self.constraints:
            trial.set_constraint("accuracy", 0.1 * sum(params[:10]) - 0.35)
            trial.set_constraint("latency", 0.5 - 0.1 * sum(params[10:N_BINARY]))
        self.seconds += time.perf_counter() - start
        return float(value)


def sampler_times(
    factory: Callable[[], optuna.samplers.BaseSampler], n_trials: int, seed: int, constraints: bool
) -> dict[str, np.ndarray]:
    """CPU and wall seconds the sampler took for each trial of one study."""
    objective = SyntheticObjective(seed, constraints)
    study = optuna.create_study(sampler=factory())
    clocks = {"cpu": time.process_time, "wall": time.perf_counter}
    times: dict[str, list[float]] = {name: [] for name in clocks}
    last = {name: clock() for name, clock in clocks.items()}

    def callback(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        for name, clock in clocks.items():
            now = clock()
            times[name].append(now - last[name])
            last[name] = now

    study.optimize(objective, n_trials=n_trials, callbacks=[callback])
    # Each interval holds one objective call; its own time (microseconds) is taken out evenly.
    return {name: np.asarray(t) - objective.seconds / n_trials for name, t in times.items()}


def summary(name: str, times: dict[str, np.ndarray]) -> dict[str, float]:
    """Mean milliseconds per trial over the run and over its last 20 trials."""
    row: dict[str, Any] = {"sampler": name}
    for clock, t in times.items():
        row[f"{clock}_mean_ms"] = 1000 * float(np.mean(t))
        row[f"{clock}_last20_ms"] = 1000 * float(np.mean(t[-20:]))
    return row


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-constraints", action="store_true", help="an unconstrained objective")
    parser.add_argument("--skip-optuna-gp", action="store_true", help="time DiscreteGPSampler only")
    parser.add_argument("--out", help="write the rows as JSON here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    """Run both samplers and print a table; returns the rows."""
    args = parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    constraints = not args.no_constraints
    samplers: dict[str, Callable[[], optuna.samplers.BaseSampler]] = {
        "oq DiscreteGPSampler": lambda: DiscreteGPSampler(seed=args.seed),
    }
    if not args.skip_optuna_gp:
        samplers["optuna GPSampler"] = lambda: optuna.samplers.GPSampler(seed=args.seed)
    rows = [summary(name, sampler_times(f, args.trials, args.seed, constraints)) for name, f in samplers.items()]
    print(f"{N_BINARY} binary + {N_FIVE_WAY} five-way categorical parameters, {args.trials} trials, "
          f"constraints: {constraints}")
    print("sampler | CPU ms/trial, mean | CPU ms, last 20 trials | wall ms/trial, mean | wall ms, last 20")
    for row in rows:
        print(
            f"{row['sampler']} | {row['cpu_mean_ms']:.1f} | {row['cpu_last20_ms']:.1f} | "
            f"{row['wall_mean_ms']:.1f} | {row['wall_last20_ms']:.1f}"
        )
    if len(rows) == 2:
        for key in ("cpu_mean_ms", "cpu_last20_ms"):
            print(f"ratio oq / optuna, {key}: {rows[0][key] / rows[1][key]:.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(["python -m benchmarks.bench_gp_speed", *(argv or sys.argv[1:])]),
                       "versions": versions(), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
