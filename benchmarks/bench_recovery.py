"""Each recovery transform on and off, side by side in one process, on the real models.

For each model, every combination of the weights' granularity and the activations' mode (every
layer int8, the other scopes at the reference's choice) is built by ``create_study``'s objective
as a trial builds it, with each transform of :data:`optuna_quant.quantization.recovery.TRANSFORMS`
off and on; every model is scored once and timed against fp32 round after round, in turn
(:func:`benchmarks.real_models.side_by_side.retime`). It prints ``acc_loss`` and the median
``lat_diff`` of each, what each transform changed (pairs of layers) and what it cost once.

``--reports`` instead reads the reports of ``benchmarks.real_models.run`` with ``gp+prior`` and
``gp+prior+no_recovery`` (the same seeds and budget, each study in a fresh process) and prints,
per method, the median over seeds of the best ``lat_diff`` within the accuracy target as the
study read it, the layers that best model keeps in fp32, how many seeds' best applies a
transform, and the transforms' one-off seconds; then each method's best configuration (the best
median over all its readings, :func:`benchmarks.real_models.side_by_side.top_configurations`) is
built and re-timed beside the other's, ``--rounds`` rounds in one process.

Example:
    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_recovery --models mnist_demo mtcnn_onet \\
        --rounds 3 --out benchmarks/results/recovery_configs.json
    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_recovery --reports benchmarks/results/recovery_mnist_demo.json \\
        --rounds 5 --out benchmarks/results/recovery_side_by_side.json
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._versions import versions
from benchmarks.real_models.run import within_target
from benchmarks.real_models.side_by_side import full_params
from benchmarks.real_models.side_by_side import open_study
from benchmarks.real_models.side_by_side import retime
from benchmarks.real_models.side_by_side import top_configurations
from benchmarks.real_models.workloads import build
from benchmarks.real_models.workloads import WORKLOADS
from optuna_quant.quantization.recovery import RECOVERY_CHOICES
from optuna_quant.quantization.recovery import TRANSFORMS
from optuna_quant.trial.space import LAYER_PREFIX


def _median(values: Sequence[float]) -> str:
    return f"{np.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]" if values else "-"


def compare(name: str, rounds: int) -> dict[str, Any]:
    """The models of ``name`` with each transform off and on: their figures and the transforms' cost."""
    workload = build(name)
    with open_study(workload) as study:
        space = study.objective.space
        distributions = space.distributions()
        transforms = [t for t in TRANSFORMS if t in distributions]
        combinations = itertools.product(
            distributions["granularity"].choices, distributions["activation_mode"].choices, transforms, RECOVERY_CHOICES
        )
        models = {
            f"{granularity}/{mode}/{transform}={choice}": study.objective.build(
                full_params(study, {"granularity": granularity, "activation_mode": mode, transform: choice})
            )
            for granularity, mode, transform, choice in combinations
        }
        quantizer = study.objective.measurer.quantizer
        sites = {t: len(TRANSFORMS[t].sites(study.objective.measurer.prepared.prepared)) for t in transforms}
        return {
            "transforms": transforms,
            "sites": sites,
            "transform_s": dict(quantizer.transform_seconds),
            "models": retime(workload, models, rounds) if models else {},
        }


def study_rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per method of a ``run`` report: each seed's best trial within the accuracy target (by
    ``lat_diff``), its layers in fp32, whether it applies a transform, and the transforms' cost."""
    rows: dict[str, dict[str, Any]] = {}
    for run in report["runs"]:
        if "trials" not in run:
            continue
        row = rows.setdefault(run["method"], {"best": [], "fp32_layers": [], "transformed": 0, "seeds": 0, "transform_s": []})
        row["seeds"] += 1
        row["transform_s"] += list(run.get("transform_s", {}).values())
        within = within_target(run["trials"], report["accuracy_loss"] / 100)
        if not within:
            continue
        best = max(within, key=lambda t: t["lat_diff"])
        row["best"].append(best["lat_diff"])
        row["fp32_layers"].append(sum(v == "fp32" for k, v in best["params"].items() if k.startswith(LAYER_PREFIX)))
        row["transformed"] += any(best["params"].get(t) == "on" for t in TRANSFORMS)
    return rows


def side_by_side(report: dict[str, Any], rounds: int) -> dict[str, Any]:
    """Each method's best configuration of ``report``, built and re-timed side by side."""
    methods = sorted({run["method"] for run in report["runs"] if "trials" in run})
    best = {}
    for method in methods:
        runs = [run for run in report["runs"] if run["method"] == method]
        (params, _), *_ = top_configurations({**report, "runs": runs}, 1)
        best[method] = params
    workload = build(report["model"])
    with open_study(workload) as study:
        models = {method: study.objective.build(full_params(study, params)) for method, params in best.items()}
    readings = retime(workload, models, rounds)
    return {method: {**readings[method], "params": best[method]} for method in methods}


def print_reports(paths: Sequence[Path], rounds: int) -> dict[str, Any]:
    """One table of :func:`study_rows` per report, then its methods' best side by side."""
    summaries = {}
    for path in paths:
        report = json.loads(path.read_text())
        rows = study_rows(report)
        retimed = side_by_side(report, rounds)
        summaries[report["model"]] = {"studies": rows, "side_by_side": retimed}
        print(f"\n{report['model']} ({report['trials']} trials, {report['int8_class']})")
        print("| method | seeds | best lat_diff within target | fp32 layers of it | seeds whose best is transformed | transform s |")
        print("| --- | --- | --- | --- | --- | --- |")
        for method, row in rows.items():
            print(
                f"| {method} | {row['seeds']} | {_median(row['best'])} | {_median(row['fp32_layers'])} | "
                f"{row['transformed']} | {_median(row['transform_s'])} |"
            )
        print(f"\nEach method's best configuration, re-timed side by side ({rounds} rounds):")
        print("| method | acc_loss % | lat_diff | applies |\n| --- | --- | --- | --- |")
        for method, row in retimed.items():
            applied = [t for t in TRANSFORMS if row["params"].get(t) == "on"] or ["none"]
            print(f"| {method} | {100 * row['acc_loss']:.2f} | {row['lat_diff']:.2f} | {', '.join(applied)} |")
    return summaries


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_recovery", description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--models", nargs="+", choices=sorted(WORKLOADS))
    what.add_argument("--reports", nargs="+", type=Path, metavar="JSON", help="summarise run reports and exit")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds of every model against fp32")
    parser.add_argument("--out", type=Path, help="JSON file the results are written to")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Compare the models given and print one table each."""
    args = parse_args(argv)
    if args.reports:
        summaries = print_reports(args.reports, args.rounds)
        if args.out is not None:
            args.out.write_text(json.dumps({"versions": versions(), "rounds": args.rounds, "reports": summaries}, indent=1))
        return summaries
    report: dict[str, Any] = {"versions": versions(), "rounds": args.rounds, "models": {}}
    for name in args.models:
        result = compare(name, args.rounds)
        report["models"][name] = result
        print(f"\n{name}: sites {result['sites']}, one-off seconds {result['transform_s']}")
        print("| configuration | acc_loss % | lat_diff |\n| --- | --- | --- |")
        for key, row in result["models"].items():
            print(f"| {key} | {100 * row['acc_loss']:.2f} | {row['lat_diff']:.2f} |")
        if args.out is not None:
            args.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
