"""Time to quality: wall seconds from ``create_study`` to a good model, per method, from the reports.

A study reaches quality at the first completed trial whose model is within the accuracy target,
runs something in int8, and whose ``lat_diff`` is at least :data:`BAR_FRACTION` of the bar: the
median over the report's studies of each study's best such ``lat_diff``. Its time is that trial's
``elapsed_s`` (from just before ``create_study``: preparation, calibration, the reference, the
sensitivity and coordination included). A recipe or peer reaches it when its one model does, in
its own ``wall_s``. Medians over seeds; ``reached`` counts the seeds that did.

Reports of one model given together (``--together``: runs of two versions of the package, say)
share one bar, set by all their studies, and each row names its report.

Example:
    python -m benchmarks.real_models.time_to_quality benchmarks/results/real_minilm_amx.json
    python -m benchmarks.real_models.time_to_quality --together before.json after.json
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from collections.abc import Sequence
import json
from pathlib import Path
import statistics
from typing import Any


BAR_FRACTION = 0.95


def study_best(run: Mapping[str, Any], accuracy_loss: float) -> float | None:
    """The best ``lat_diff`` of a study's trials within ``accuracy_loss`` (a fraction) that quantize."""
    within = [t["lat_diff"] for t in run["trials"] if _good(t, accuracy_loss)]
    return max(within, default=None)


def bar(report: Mapping[str, Any]) -> float:
    """The ``lat_diff`` that counts as quality: :data:`BAR_FRACTION` of the median study best."""
    accuracy_loss = report["accuracy_loss"] / 100
    bests = [b for run in report["runs"] if "trials" in run if (b := study_best(run, accuracy_loss)) is not None]
    return BAR_FRACTION * statistics.median(bests)


def together(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Reports of one model as one, each run's method prefixed with its report's name.

    Raises:
        ValueError: If the reports are of other models, CPU classes or accuracy targets.
    """
    first = next(iter(reports.values()))
    keys = ("model", "int8_class", "accuracy_loss")
    for name, report in reports.items():
        if any(report.get(key) != first.get(key) for key in keys):
            raise ValueError(f"{name}: another {'/'.join(keys)} than the first report's; give reports of one model together.")
    runs = [{**run, "method": f"{name}: {run['method']}"} for name, report in reports.items() for run in report["runs"]]
    return {**first, "runs": runs}


def seconds_to_quality(run: Mapping[str, Any], accuracy_loss: float, threshold: float) -> float | None:
    """When a study or a recipe first held a model within ``accuracy_loss`` at ``threshold`` or faster."""
    if "trials" not in run:
        good = run.get("acc_loss") is not None and run["acc_loss"] <= accuracy_loss and run["lat_diff"] >= threshold
        return run["wall_s"] if good else None
    times = [t["elapsed_s"] for t in run["trials"] if _good(t, accuracy_loss) and t["lat_diff"] >= threshold]
    return min(times, default=None)


def table(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per method: its median seconds to quality over the seeds that reached it."""
    accuracy_loss = report["accuracy_loss"] / 100
    threshold = bar(report)
    by_method: dict[str, list[float | None]] = {}
    for run in report["runs"]:
        if "error" not in run:
            by_method.setdefault(run["method"], []).append(seconds_to_quality(run, accuracy_loss, threshold))
    rows = []
    for method, times in by_method.items():
        reached = [t for t in times if t is not None]
        rows.append({
            "method": method,
            "seconds": statistics.median(reached) if reached else None,
            "reached": len(reached),
            "runs": len(times),
        })
    return sorted(rows, key=lambda row: (row["seconds"] is None, row["seconds"] or 0.0))


def _good(trial: Mapping[str, Any], accuracy_loss: float) -> bool:
    return (
        trial.get("acc_loss") is not None
        and trial["acc_loss"] <= accuracy_loss
        and trial.get("quantized", True) is not False
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="real-model reports (benchmarks/results/real_*.json)")
    parser.add_argument("--together", action="store_true", help="the reports are of one model: one bar, one table")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    loaded = {path.name: json.loads(path.read_text()) for path in args.reports}
    named = {" + ".join(loaded): together(loaded)} if args.together else loaded
    for name, report in named.items():
        print(f"\n{name}: {report['model']} ({report.get('int8_class', '?')}), quality = lat_diff >= {bar(report):.3f} within {report['accuracy_loss']} %")
        print("| method | seconds to quality (median) | reached |")
        print("| --- | --- | --- |")
        for row in table(report):
            seconds = "–" if row["seconds"] is None else f"{row['seconds']:.1f}"
            print(f"| {row['method']} | {seconds} | {row['reached']} of {row['runs']} |")


if __name__ == "__main__":
    main()
