"""Diagnostic: what the GP sampler loses by learning its hyperparameters from a few trials.

``DiscreteGPSampler`` fits each constraint GP's hyperparameters (relevance of every parameter,
variances, noise) by marginal likelihood on the trials seen so far, a dozen at most before the
target is met. Here they are fitted once on up to 400 rows of the table, knowledge that no
study has, and kept fixed while the study runs (each trial only conditions the GPs on its data).
Both samplers run side by side on the same tables and seeds, stopping at the target; the gap
between them is what learning the hyperparameters costs (or, where the oracle is slower, what
the fitted ones happen to gain). For the default sampler it also compares how well the fitted
and the oracle's hyperparameters explain each study's trials (log marginal likelihood): where
the two are close, the trials cannot tell the better hyperparameters apart.

Example:
    .venv/bin/python -m benchmarks.gp_oracle --seeds 100 --seed-offset 100 --jobs 2
"""

from __future__ import annotations

import os


# One thread per process, as in bench_samplers; set before numpy loads.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
import copy  # noqa: E402
from functools import lru_cache  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import optuna  # noqa: E402

from benchmarks._versions import versions  # noqa: E402
from benchmarks.bench_samplers import quartiles  # noqa: E402
from benchmarks.bench_samplers import run_optuna  # noqa: E402
from benchmarks.bench_samplers import trials_to_target  # noqa: E402
from benchmarks.table import Table  # noqa: E402
from benchmarks.table import table_paths  # noqa: E402
from optuna_quant.samplers import DiscreteGPSampler  # noqa: E402
from optuna_quant.samplers._discrete import DiscreteSpace  # noqa: E402
from optuna_quant.samplers._gp import BayesianOptimization  # noqa: E402
from optuna_quant.samplers._gp.gp import DiscreteGP  # noqa: E402
from optuna_quant.samplers._gp.warp import warp  # noqa: E402


FIT_ROWS = 400
VARIANTS = ("default", "oracle")


class FixedGP(DiscreteGP):
    """A GP whose hyperparameters stay as they are: every fit only conditions on the data."""

    def fit(self, X: np.ndarray, y: np.ndarray, optimize: bool | None = None) -> DiscreteGP:
        return super().fit(X, y, optimize=False)


def oracle_gps(table: Table, rows: int = FIT_ROWS, seed: int = 0) -> list[FixedGP]:
    """One GP per constraint (accuracy, latency), its hyperparameters fitted on ``rows`` table rows.

    The constraint values are warped as the sampler warps them, so that the hyperparameters mean
    the same thing in the study.
    """
    names = table.names
    X = np.array([[table.params[n].index(row["params"][n]) for n in names] for row in table.rows])
    values = np.array([list(table.constraints(r).values()) for r in table.rows])
    pick = np.random.RandomState(seed).choice(len(X), size=min(rows, len(X)), replace=False)
    n_choices = [len(table.params[n]) for n in names]
    gps = []
    for column in values.T:
        gp = FixedGP(n_choices)
        DiscreteGP.fit(gp, X[pick], warp(column[pick], centre=0.0), optimize=True)
        gps.append(gp)
    return gps


class OracleGPSampler(DiscreteGPSampler):
    """``DiscreteGPSampler`` whose constraint GPs are copies of the given fixed-hyperparameter GPs.

    A diagnostic only: it reaches into the optimiser, which has no public hook for its models.
    """

    def __init__(self, gps: Sequence[FixedGP], *, seed: int) -> None:
        super().__init__(seed=seed)
        self._oracle = list(gps)

    def _optimizer_for(self, study: Any, space: DiscreteSpace, history: Any) -> BayesianOptimization:
        optimizer = super()._optimizer_for(study, space, history)
        if not optimizer._constraint_gps:
            optimizer._constraint_gps = copy.deepcopy(self._oracle)
        return optimizer


@lru_cache(maxsize=None)
def _table_and_gps(path: str) -> tuple[Table, list[FixedGP]]:
    table = Table.load(path)
    return table, oracle_gps(table)


def run_one(task: tuple[str, str, int, int]) -> tuple[int, list[float] | None]:
    """One study: ``(table path, "default" or "oracle", seed, budget)``.

    Returns its trials-to-target and, for the default sampler, how much better each constraint
    GP's fitted hyperparameters explain the trials it was last fitted on (the trials before the
    hit) than the oracle's do: fitted minus oracle log marginal likelihood, in nats (``None``
    when the first trial met the targets and no GP was fitted).
    """
    path, variant, seed, budget = task
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    table, gps = _table_and_gps(path)
    sampler = OracleGPSampler(gps, seed=seed) if variant == "oracle" else DiscreteGPSampler(seed=seed)
    trace = run_optuna(lambda s: sampler, table, seed, budget, constraints=True, stop_at_target=True)
    gaps = None
    if variant == "default" and sampler._optimizer is not None and sampler._optimizer._constraint_gps:
        fitted = sampler._optimizer._constraint_gps
        gaps = [gp.log_marginal_likelihood() - gp.log_marginal_likelihood(o.log_params) for gp, o in zip(fitted, gps)]
    return trials_to_target(trace, table, budget), gaps


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="studies per variant and table")
    parser.add_argument("--seed-offset", type=int, default=0, help="first seed")
    parser.add_argument("--budget", type=int, default=100, help="trials per study at most")
    parser.add_argument("--tables", nargs="+", help="table names (file stems); default: all")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--out", type=Path, help="JSON results file (default: none)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run both variants on every table and seed, print a Markdown table, return the results."""
    args = parse_args(argv)
    paths = [str(p) for p in table_paths(args.tables)]
    seeds = range(args.seed_offset, args.seed_offset + args.seeds)
    tasks = [(p, v, s, args.budget) for p in paths for v in VARIANTS for s in seeds]
    with ProcessPoolExecutor(args.jobs) as pool:
        outcomes = dict(zip(tasks, pool.map(run_one, tasks, chunksize=4)))
    results: dict[str, Any] = {
        "command": ".venv/bin/python -m benchmarks.gp_oracle " + " ".join(sys.argv[1:] if argv is None else argv),
        "versions": versions(),
        "seeds": [seeds.start, seeds.stop - 1],
        "budget": args.budget,
        "tables": {},
    }
    print(
        "| table | default: median (IQR) | oracle hyperparameters: median (IQR) "
        "| log likelihood, fitted minus oracle, median: accuracy GP | latency GP |"
    )
    print("|---|---|---|---|---|")
    for path in paths:
        entry: dict[str, Any] = {}
        for variant in VARIANTS:
            hits = [outcomes[(path, variant, s, args.budget)][0] for s in seeds]
            q25, median, q75 = quartiles(hits)
            entry[variant] = {"median": median, "q25": q25, "q75": q75, "per_seed": hits}
        gaps = [g for s in seeds if (g := outcomes[(path, "default", s, args.budget)][1]) is not None]
        entry["log_likelihood_gap"] = {"median": np.median(gaps, axis=0).tolist(), "per_seed": gaps}
        results["tables"][Path(path).stem] = entry
        cells = [f"{entry[v]['median']:.1f} ({entry[v]['q25']:.1f}-{entry[v]['q75']:.1f})" for v in VARIANTS]
        cells += [f"{gap:.1f}" for gap in entry["log_likelihood_gap"]["median"]]
        print(f"| {Path(path).stem} | " + " | ".join(cells) + " |")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
