"""Leave one table out: each constant of the prior chosen on every table but one, judged on that one.

For each constant of :data:`CONSTANTS`, each of its values is set in turn (the others at their
defaults) and optuna-quant's two samplers replay every table with the prior
(``bench_samplers --prior sensitivity --stop-at-target``, ``--seeds`` seeds from
``--seed-offset``); once more without the prior. A value's cost on a set of tables is the sum of
the log median trials to target, both samplers. For each table (fold), the value with the least
cost on the other tables is chosen, and the table is judged with it: its median trials to target
against the default's and against no prior. Ties keep the default::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m benchmarks.loto --seeds 20 --out benchmarks/results/loto_seeds0.json

The constants are module attributes that the samplers and the prior read when they run; they are
set in this process, so the replays run in it (one process, no ``--jobs``).
"""

from __future__ import annotations

import os


for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from contextlib import contextmanager  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from benchmarks import bench_samplers  # noqa: E402
from benchmarks._versions import versions  # noqa: E402


CONSTANTS: dict[str, tuple[str, tuple[float, ...]]] = {
    "FADED_AT": ("optuna_quant.samplers._prior", (0.5, 1.0, 2.0)),
    "MATERIAL_BENEFIT": ("optuna_quant.trial.scoring", (0.01, 0.02, 0.05)),
    "REVERT_RESOLUTION": ("optuna_quant.trial.scoring", (0.03, 0.06, 0.1)),
    "INTERACTION_SHARE": ("optuna_quant.trial.scoring", (0.25, 0.5, 0.75)),
}
"""Each constant: its module and the values tried, the default among them."""
TABLES = ("dwsep", "mlp", "widecnn", "mobilenet8", "silero_vad", "mtcnn_rnet", "mtcnn_onet")
"""The tables with a measured sensitivity (``build_tables --sensitivity-only``)."""
SAMPLERS = ("oq-gp", "oq-tpe")


@contextmanager
def constant_set(name: str, value: float) -> Iterator[None]:
    """``name`` of :data:`CONSTANTS` at ``value`` for the duration of the block."""
    module = importlib.import_module(CONSTANTS[name][0])
    default = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, default)


def medians(seeds: int, seed_offset: int, prior: bool) -> dict[str, dict[str, float]]:
    """``{table: {sampler: median trials to target}}`` of one replay of every table."""
    argv = ["--seeds", str(seeds), "--seed-offset", str(seed_offset), "--budget", "100", "--stop-at-target"]
    argv += ["--tables", *TABLES, "--samplers", *SAMPLERS, *(["--prior", "sensitivity"] if prior else [])]
    report = bench_samplers.run_report(bench_samplers.parse_args(argv), argv)
    return {
        table: {name.split("+")[0]: s["trials_to_target"]["median"] for name, s in entry["samplers"].items()}
        for table, entry in report["tables"].items()
    }


def cost(runs: dict[str, dict[str, float]], tables: Sequence[str]) -> float:
    """The sum of the log median trials to target of both samplers over ``tables``."""
    return sum(math.log(runs[table][sampler]) for table in tables for sampler in SAMPLERS)


def folds(
    by_value: dict[float, dict[str, dict[str, float]]], default: float, no_prior: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """Per held-out table, the value chosen on the others and the table's medians with it, with
    the default and without the prior."""
    judged = {}
    for table in TABLES:
        others = [t for t in TABLES if t != table]
        # min() keeps the first of equal costs: the default is put first.
        chosen = min(sorted(by_value, key=lambda v: v != default), key=lambda v: cost(by_value[v], others))
        judged[table] = {
            "chosen": chosen,
            "with_chosen": by_value[chosen][table],
            "with_default": by_value[default][table],
            "without_prior": no_prior[table],
        }
    return judged


def format_report(report: dict[str, Any]) -> str:
    """A markdown table: per held-out table, the medians (GP / TPE) without the prior, with the
    defaults, and with each constant at the value the other tables chose."""
    names = list(report["constants"])
    chosen = " | ".join(f"{name} chosen: value, medians" for name in names)
    lines = [
        f"| held-out table | no prior | defaults | {chosen} |",
        "|---" * (3 + len(names)) + "|",
    ]

    def pair(medians: dict[str, float]) -> str:
        return " / ".join(f"{medians[sampler]:g}" for sampler in SAMPLERS)

    for table in TABLES:
        folds_of = [report["constants"][name]["folds"][table] for name in names]
        cells = [table, pair(folds_of[0]["without_prior"]), pair(folds_of[0]["with_default"])]
        cells += [f"{fold['chosen']:g}: {pair(fold['with_chosen'])}" for fold in folds_of]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--seed-offset", type=int, default=0)
    parser.add_argument("--constants", nargs="+", choices=sorted(CONSTANTS), default=sorted(CONSTANTS))
    parser.add_argument("--out", type=Path, required=True, help="JSON results file")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    report: dict[str, Any] = {"seeds": [args.seed_offset, args.seed_offset + args.seeds - 1], "versions": versions()}
    report["no_prior"] = medians(args.seeds, args.seed_offset, prior=False)
    defaults = {name: getattr(importlib.import_module(module), name) for name, (module, _) in CONSTANTS.items()}
    with_defaults = medians(args.seeds, args.seed_offset, prior=True)
    report["constants"] = {}
    for name in args.constants:
        by_value = {defaults[name]: with_defaults}
        for value in CONSTANTS[name][1]:
            if value != defaults[name]:
                with constant_set(name, value):
                    by_value[value] = medians(args.seeds, args.seed_offset, prior=True)
        report["constants"][name] = {
            "default": defaults[name],
            "medians": {str(value): runs for value, runs in by_value.items()},
            "folds": folds(by_value, defaults[name], report["no_prior"]),
        }
        print(name, json.dumps(report["constants"][name]["folds"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(format_report(report))
    return report


if __name__ == "__main__":
    main()
