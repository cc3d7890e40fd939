"""Time to quality: wall seconds from ``create_study`` to a good model, per method, from the reports.

A study reaches quality at the first completed trial whose model is within the accuracy target,
runs something in int8, and whose ``lat_diff`` is at least :data:`BAR_FRACTION` of the bar: the
median over the report's studies of each study's best such ``lat_diff``. Its time is that trial's
``elapsed_s`` (from just before ``create_study``: preparation, calibration, the reference, the
sensitivity and coordination included). A recipe or peer reaches it when its one model does, in
its own ``wall_s``; a study's trials up to it are counted too (``trials``: what the machine's load
does not change). Medians over every seed, a seed that never reached it counting as never (so
a method that reached it in half its seeds or fewer has no time); ``reached`` counts the seeds
that did; ``final`` is the median of each run's best ``lat_diff`` within the target (a study's
over all its trials).

Reports of one model given together (``--together``: runs of two versions of the package, say)
share one bar, set by all their studies, and each row names its report.

``--by-model`` prints one table for all the reports given, a row per model and a column per
method.

Example:
    python -m benchmarks.real_models.time_to_quality benchmarks/results/real_minilm_amx.json
    python -m benchmarks.real_models.time_to_quality --together before.json after.json
    python -m benchmarks.real_models.time_to_quality --by-model a.json b.json --methods gp,ort_dynamic
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from collections.abc import Sequence
import json
import math
from pathlib import Path
import statistics
from typing import Any


BAR_FRACTION = 0.95


def study_best(run: Mapping[str, Any], accuracy_loss: float) -> float | None:
    """The best ``lat_diff`` of a study's trials within ``accuracy_loss`` (a fraction) that quantize."""
    within = [t["lat_diff"] for t in run["trials"] if _good(t, accuracy_loss)]
    return max(within, default=None)


def run_best(run: Mapping[str, Any], accuracy_loss: float) -> float | None:
    """A study's :func:`study_best`, or a recipe's or peer's one model's ``lat_diff`` if it is good."""
    return study_best(run, accuracy_loss) if "trials" in run else (run["lat_diff"] if _good(run, accuracy_loss) else None)


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


def trials_to_quality(run: Mapping[str, Any], accuracy_loss: float, threshold: float) -> int | None:
    """How many trials a study ran up to its first at quality (that one included), or ``None``
    (never, or a recipe). Unlike the seconds, the machine's load does not change it."""
    numbers = [t["number"] for t in run.get("trials", ()) if _good(t, accuracy_loss) and t["lat_diff"] >= threshold]
    return min(numbers) + 1 if numbers else None


def table(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per method: its median seconds to quality over its seeds (``None``: never, for most)."""
    accuracy_loss = report["accuracy_loss"] / 100
    threshold = bar(report)
    by_method: dict[str, list[Mapping[str, Any]]] = {}
    for run in report["runs"]:
        if "error" not in run:
            by_method.setdefault(run["method"], []).append(run)
    rows = []
    for method, runs in by_method.items():
        seconds = [seconds_to_quality(run, accuracy_loss, threshold) for run in runs]
        finals = [best for run in runs if (best := run_best(run, accuracy_loss)) is not None]
        trials = _median_or_never([trials_to_quality(run, accuracy_loss, threshold) for run in runs])
        rows.append({
            "method": method,
            "seconds": _median_or_never(seconds),
            "trials": None if "trials" not in runs[0] else trials,
            "reached": sum(value is not None for value in seconds),
            "runs": len(runs),
            "final": statistics.median(finals) if finals else None,
        })
    return sorted(rows, key=lambda row: (row["seconds"] is None, row["seconds"] or 0.0))


def _median_or_never(values: Sequence[float | None]) -> float | None:
    """The median of ``values``, ``None`` counting as never (``None`` if that is the median)."""
    median = statistics.median([math.inf if value is None else value for value in values])
    return None if math.isinf(median) else median


def by_model(reports: Mapping[str, Mapping[str, Any]], methods: Sequence[str] | None = None) -> list[str]:
    """One markdown table of ``reports`` (one per model): a row per model, a column per method
    (``methods``, or every method in the order they first appear), each cell
    ``seconds / trials (reached of runs), final`` (a recipe's without trials).

    Example:
        >>> study = {"method": "tpe", "seed": 0, "trials": [{"number": 0, "elapsed_s": 9.0, "acc_loss": 0.0, "lat_diff": 2.0}]}
        >>> recipe = {"method": "ort_dynamic", "seed": 0, "acc_loss": 0.004, "lat_diff": 1.8, "wall_s": 7.0}
        >>> by_model({"r.json": {"model": "m", "int8_class": "x86-amx", "accuracy_loss": 1.0, "runs": [study, recipe]}})[2]
        '| m (x86-amx) | 1.90 | 9.0 s / 1 (1 of 1), 2.00 | – (0 of 1), 1.80 |'
    """
    tables = {name: table(report) for name, report in reports.items()}
    if methods is None:
        methods = list(dict.fromkeys(row["method"] for rows in tables.values() for row in rows))
    lines = ["| model (class) | bar | " + " | ".join(methods) + " |", "| --- " * (len(methods) + 2) + "|"]
    for name, report in reports.items():
        rows = {row["method"]: row for row in tables[name]}
        cells = [_cell(rows.get(method)) for method in methods]
        lines.append(f"| {report['model']} ({report.get('int8_class', '?')}) | {bar(report):.2f} | " + " | ".join(cells) + " |")
    return lines


def _cell(row: Mapping[str, Any] | None) -> str:
    if row is None:
        return ""
    seconds = "–" if row["seconds"] is None else f"{row['seconds']:.1f} s"
    if row["seconds"] is not None and row["trials"] is not None:
        seconds += f" / {row['trials']:g}"
    final = "–" if row["final"] is None else f"{row['final']:.2f}"
    return f"{seconds} ({row['reached']} of {row['runs']}), {final}"


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
    parser.add_argument("--by-model", action="store_true", help="one table: a row per report's model, a column per method")
    parser.add_argument("--methods", type=lambda text: text.split(","), help="with --by-model: these columns, comma-separated")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    loaded = {path.name: json.loads(path.read_text()) for path in args.reports}
    if args.by_model:
        print("\n".join(by_model(loaded, args.methods)))
        return
    named = {" + ".join(loaded): together(loaded)} if args.together else loaded
    for name, report in named.items():
        print(f"\n{name}: {report['model']} ({report.get('int8_class', '?')}), quality = lat_diff >= {bar(report):.3f} within {report['accuracy_loss']} %")
        print("| method | seconds to quality (median) | trials to quality (median) | reached | best lat_diff within target (median) |")
        print("| --- | --- | --- | --- | --- |")
        for row in table(report):
            seconds = "–" if row["seconds"] is None else f"{row['seconds']:.1f}"
            trials = "–" if row["trials"] is None else f"{row['trials']:g}"
            final = "–" if row["final"] is None else f"{row['final']:.3f}"
            print(f"| {row['method']} | {seconds} | {trials} | {row['reached']} of {row['runs']} | {final} |")


if __name__ == "__main__":
    main()
