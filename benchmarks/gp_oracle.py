"""Diagnostic: what the GP sampler loses by learning its hyperparameters from a few trials.

``DiscreteGPSampler`` fits each constraint GP's hyperparameters (relevance of every parameter,
variances, noise) by marginal likelihood on the trials seen so far, a dozen at most before the
target is met. Here they are fitted once on up to 400 rows of the table, knowledge that no
study has, and kept fixed while the study runs (each trial only conditions the GPs on its data).
Both samplers run side by side on the same tables and seeds, stopping at the target; the gap
between them is what learning the hyperparameters costs (or, where the oracle is slower, what
the fitted ones happen to gain).

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
from benchmarks.bench_samplers import quartiles, run_optuna, trials_to_target  # noqa: E402
from benchmarks.table import Table, table_paths  # noqa: E402
from optuna_quant.samplers import DiscreteGPSampler  # noqa: E402
from optuna_quant.samplers._discrete import DiscreteSpace  # noqa: E402
from optuna_quant.samplers._gp_kernel import DiscreteGP  # noqa: E402
from optuna_quant.samplers.bayesian import BayesianOptimization, _warp  # noqa: E402

FIT_ROWS = 400


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
    values = np.array([list(table.target.constraints(r["acc_loss"], r["lat_diff"]).values()) for r in table.rows])
    pick = np.random.RandomState(seed).choice(len(X), size=min(rows, len(X)), replace=False)
    n_choices = [len(table.params[n]) for n in names]
    gps = []
    for column in values.T:
        gp = FixedGP(n_choices)
        DiscreteGP.fit(gp, X[pick], _warp(column[pick], centre=0.0), optimize=True)
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


def run_one(task: tuple[str, str, int, int]) -> int:
    """Trials-to-target of one study: ``(table path, "default" or "oracle", seed, budget)``."""
    path, variant, seed, budget = task
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    table, gps = _table_and_gps(path)
    if variant == "oracle":
        factory = lambda s: OracleGPSampler(gps, seed=s)  # noqa: E731
    else:
        factory = lambda s: DiscreteGPSampler(seed=s)  # noqa: E731
    trace = run_optuna(factory, table, seed, budget, constraints=True, stop_at_target=True)
    return trials_to_target(trace, table, budget)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run both variants on every table and seed, print a Markdown table, return the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20, help="studies per variant and table")
    parser.add_argument("--seed-offset", type=int, default=0, help="first seed")
    parser.add_argument("--budget", type=int, default=100, help="trials per study at most")
    parser.add_argument("--tables", nargs="+", help="table names (file stems); default: all")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--out", type=Path, help="JSON results file (default: none)")
    args = parser.parse_args(argv)
    paths = [str(p) for p in table_paths(args.tables)]
    seeds = range(args.seed_offset, args.seed_offset + args.seeds)
    tasks = [(p, v, s, args.budget) for p in paths for v in ("default", "oracle") for s in seeds]
    with ProcessPoolExecutor(args.jobs) as pool:
        hits = list(pool.map(run_one, tasks, chunksize=4))
    results: dict[str, Any] = {
        "command": ".venv/bin/python -m benchmarks.gp_oracle " + " ".join(sys.argv[1:] if argv is None else argv),
        "versions": versions(),
        "seeds": [seeds.start, seeds.stop - 1],
        "budget": args.budget,
        "tables": {},
    }
    print("| table | default: median (IQR) | oracle hyperparameters: median (IQR) |")
    print("|---|---|---|")
    for i, path in enumerate(paths):
        name = Path(path).stem
        cells, per_variant = [], {}
        for j, variant in enumerate(("default", "oracle")):
            start = (2 * i + j) * len(seeds)
            seed_hits = hits[start : start + len(seeds)]
            q25, median, q75 = quartiles(seed_hits)
            cells.append(f"{median:.1f} ({q25:.1f}-{q75:.1f})")
            per_variant[variant] = {"median": median, "q25": q25, "q75": q75, "per_seed": seed_hits}
        results["tables"][name] = per_variant
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
