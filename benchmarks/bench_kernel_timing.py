"""How steady the sensitivity's timing of the kernels is: the all-int8 model of each granularity
of a table's model, timed against fp32 again and again.

Two ways, side by side in one process: ``--calls`` single paired timings as a table row is timed
(``build_tables.BENCHMARK``), then ``--measurements`` runs of
:func:`optuna_quant.measure.sensitivity.measure_kernel_speed` (three rounds, the median) on the
same models and input. The table's rows give the reference: the median ``lat_diff`` of each
granularity over all rows, and that of the all-int8 rows. Run from the repository root::

    .venv/bin/python -m benchmarks.bench_kernel_timing --tables mtcnn_rnet mtcnn_onet --out benchmarks/results/kernel_timing.json
"""

from __future__ import annotations

import os


# One thread: latency is measured on one thread, and the machine is shared.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
from collections.abc import Sequence  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

from benchmarks._versions import versions  # noqa: E402
from benchmarks.build_tables import BENCHMARK  # noqa: E402
from benchmarks.build_tables import setup  # noqa: E402
from benchmarks.build_tables import SPECS  # noqa: E402
from benchmarks.real_models.base import session  # noqa: E402
from benchmarks.table import Table  # noqa: E402
from benchmarks.table import TABLES_DIR  # noqa: E402
from optuna_quant.measure.latency import measure_latency  # noqa: E402
from optuna_quant.measure.sensitivity import measure_kernel_speed  # noqa: E402
from optuna_quant.trial.budget import all_int8  # noqa: E402
from optuna_quant.trial.space import LAYER_PREFIX  # noqa: E402


GRANULARITIES = ("per_channel", "per_tensor")


def from_rows(table: Table) -> dict[str, dict[str, float]]:
    """Per granularity, the median ``lat_diff`` of all the table's rows and of its all-int8 rows."""
    layers = [name for name in table.params if name.startswith(LAYER_PREFIX)]
    found: dict[str, dict[str, float]] = {}
    for granularity in GRANULARITIES:
        rows = [row for row in table.rows if row["params"]["granularity"] == granularity]
        all_int8_rows = [row for row in rows if all(row["params"][layer] == "int8" for layer in layers)]
        found[granularity] = {
            "rows_median": statistics.median(row["lat_diff"] for row in rows),
            "all_int8_rows": statistics.median(row["lat_diff"] for row in all_int8_rows),
        }
    return found


def measure(name: str, calls: int, measurements: int) -> dict[str, Any]:
    """The two ways of timing the granularities of table ``name``'s model, and its rows' figures."""
    objective = setup(name).objective
    model, quantizer, feed = objective.measurer.model, objective.measurer.quantizer, objective.measurer.latency_feed
    combinations = [{"granularity": granularity, "range_estimator": "minmax"} for granularity in GRANULARITIES]
    fp32 = session(model)
    int8 = [session(quantizer.quantize(all_int8(objective.space, params))) for params in combinations]
    single = [[measure_latency(fp32, each, feed, BENCHMARK).lat_diff for each in int8] for _ in range(calls)]
    # The errors are not what is measured here: every combination gets the same one.
    errors = [{"params": params, "error": 1.0} for params in combinations]
    runs = [
        measure_kernel_speed(model, quantizer, errors, lambda p: all_int8(objective.space, p), BENCHMARK, feed)
        for _ in range(measurements)
    ]
    return {
        "rows": from_rows(Table.load(TABLES_DIR / f"{name}.json")),
        "single_calls": [dict(zip(GRANULARITIES, readings)) for readings in single],
        "measure_kernel_speed": [{entry["params"]["granularity"]: entry["lat_diff"] for entry in run} for run in runs],
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    held_out = sorted(name for name, spec in SPECS.items() if spec.scopes and "granularity" in spec.scopes)
    parser.add_argument("--tables", nargs="+", choices=held_out, default=["mtcnn_rnet", "mtcnn_onet"])
    parser.add_argument("--calls", type=int, default=4, help="single paired timings of each granularity")
    parser.add_argument("--measurements", type=int, default=4, help="runs of measure_kernel_speed")
    parser.add_argument("--out", type=Path, help="write the figures to this JSON file")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Measure, print and (with ``--out``) write the figures."""
    args = parse_args(argv)
    report = {
        "command": "python -m benchmarks.bench_kernel_timing " + " ".join(argv if argv is not None else sys.argv[1:]),
        "versions": versions(),
        "tables": {name: measure(name, args.calls, args.measurements) for name in args.tables},
    }
    for name, figures in report["tables"].items():
        print(name, "rows:", {g: {k: round(v, 3) for k, v in f.items()} for g, f in figures["rows"].items()})
        for way in ("single_calls", "measure_kernel_speed"):
            print(" ", way, [tuple(round(reading[g], 3) for g in GRANULARITIES) for reading in figures[way]])
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
