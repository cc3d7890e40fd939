"""Whether the sensitivity prior slows a sampler down on a table, with every seed of every run.

Reads ``bench_samplers`` reports (``--stop-at-target``), pairs each sampler with its ``+prior``
run on the same table and seeds, and pools the seed sets: median trials to target each way and a
one-sided Mann-Whitney U test of "the prior needs more trials". A median worse with the prior is
a chance reading unless the test says otherwise (``p`` below :data:`ALPHA`).

Per table it also reads the configurations that quantize nothing (rows marked ``quantized``
false: every node in fp32, the fp32 model), timed once per combination of the other scopes. Where
the latency target lies between those readings, the timing's noise would decide whether the fp32
model meets it, had it not been ruled out of the targets (``Table.met``)::

    .venv/bin/python -m benchmarks.prior_effect --out benchmarks/results/prior_effect.json

The default reports are the committed no-prior and prior runs of every table with a measured
sensitivity (:data:`REPORTS`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import json
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import mannwhitneyu

from benchmarks.bench_samplers import RESULTS_DIR
from benchmarks.table import quantized
from benchmarks.table import Table
from benchmarks.table import table_paths


ALPHA = 0.05
PRIOR = "+prior"
REPORTS = tuple(
    RESULTS_DIR / f"{name}_seeds{offset}.json"
    for name in (
        "noprior", "prior_sensitivity", "mobilenet8", "mobilenet8_prior_sensitivity",
        "wheels", "wheels_prior_sensitivity", "wheels_onet", "wheels_onet_prior_sensitivity",
    )
    for offset in (0, 100)
)
"""The committed runs, without and with the prior, on seeds 0-19 and 100-119 (docs/benchmarks.md)."""


def trials_by_seed(reports: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[int, int]]:
    """``{(table, sampler): {seed: trials to target}}`` over ``reports``.

    Raises:
        ValueError: If a report did not stop at the target, or two give one seed different figures.
    """
    found: dict[tuple[str, str], dict[int, int]] = {}
    for report in reports:
        if not report.get("stop_at_target"):
            raise ValueError(f"{report['commands']}: not run with --stop-at-target")
        for table, entry in report["tables"].items():
            for sampler, summary in entry["samplers"].items():
                seeds = found.setdefault((table, sampler), {})
                for seed, trials in zip(report["seeds"], summary["trials_to_target"]["per_seed"]):
                    if seeds.setdefault(seed, trials) != trials:
                        raise ValueError(f"{table} {sampler} seed {seed}: {seeds[seed]} and {trials} trials")
    return found


def compare(without: dict[int, int], with_prior: dict[int, int]) -> dict[str, Any]:
    """The prior's effect over the seeds both runs have.

    Example:
        >>> effect = compare({s: 10 + s % 3 for s in range(20)}, {s: 3 + s % 2 for s in range(20)})
        >>> effect["median"], effect["median_prior"], effect["worse"]
        (11.0, 3.5, False)
    """
    seeds = sorted(set(without) & set(with_prior))
    x = np.array([without[s] for s in seeds])
    y = np.array([with_prior[s] for s in seeds])
    p = float(mannwhitneyu(y, x, alternative="greater").pvalue)
    return {
        "seeds": len(seeds),
        "median": float(np.median(x)),
        "median_prior": float(np.median(y)),
        "p_prior_worse": round(p, 4),
        "worse": p < ALPHA,
    }


def fp32_reads(table: Table) -> dict[str, Any]:
    """The ``lat_diff`` readings of the configurations that quantize nothing (the fp32 model)
    against the latency target: whether it lies between them.

    Example:
        >>> rows = [{"params": {"layer:a": layer, "g": g}, "acc_loss": 0.0 if layer == "fp32" else 0.02,
        ...          "lat_diff": {"c": 0.997, "t": 1.002}[g] + (layer == "int8"), "quantized": layer == "int8"}
        ...         for layer in ("int8", "fp32") for g in ("c", "t")]
        >>> table = Table(name="t", description="", params={"layer:a": ["int8", "fp32"], "g": ["c", "t"]},
        ...               targets={"accuracy_loss": 1.0, "latency_reduce": 1.0}, fp32={}, rows=rows)
        >>> fp32_reads(table)
        {'latency_reduce': 1.0, 'fp32_lat_diff': [0.997, 1.002], 'target_within_noise': True}
    """
    reads = [row["lat_diff"] for row in table.rows if not quantized(row)]
    target = table.target.latency_reduce
    return {
        "latency_reduce": target,
        "fp32_lat_diff": [round(min(reads), 4), round(max(reads), 4)] if reads else None,
        "target_within_noise": bool(reads) and min(reads) < target <= max(reads),
    }


def prior_effect(reports: Sequence[dict[str, Any]], tables: dict[str, Table]) -> dict[str, Any]:
    """Per table and sampler with a ``+prior`` run: :func:`compare`; per table: :func:`fp32_reads`."""
    runs = trials_by_seed(reports)
    effect: dict[str, Any] = {}
    for (table, sampler), with_prior in sorted(runs.items()):
        base = sampler.removesuffix(PRIOR)
        if base == sampler or (table, base) not in runs:
            continue
        entry = effect.setdefault(table, {**fp32_reads(tables[table]), "samplers": {}})
        entry["samplers"][base] = compare(runs[table, base], with_prior)
    return effect


def format_effect(effect: dict[str, Any]) -> str:
    """A markdown table of :func:`prior_effect`."""
    lines = [
        "| table | sampler | seeds | median, no prior | median, prior | p (prior worse) | fp32 model reads | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for table, entry in effect.items():
        reads = entry["fp32_lat_diff"]
        noise = " (within)" if entry["target_within_noise"] else ""
        for sampler, e in entry["samplers"].items():
            p = f"**{e['p_prior_worse']}**" if e["worse"] else str(e["p_prior_worse"])
            lines.append(
                f"| {table} | {sampler} | {e['seeds']} | {e['median']:g} | {e['median_prior']:g} | {p} | "
                f"{'-' if reads is None else f'{reads[0]}-{reads[1]}'} | {entry['latency_reduce']}{noise} |"
            )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", nargs="+", type=Path, default=list(REPORTS), help="bench_samplers reports")
    parser.add_argument("--out", type=Path, help="write the figures here (JSON)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    missing = [str(path) for path in args.reports if not path.is_file()]
    if missing:
        raise SystemExit(f"no such report: {', '.join(missing)}")
    reports = [json.loads(path.read_text()) for path in args.reports]
    tables = {path.stem: Table.load(path) for path in table_paths()}
    effect = prior_effect(reports, tables)
    print(format_effect(effect))
    if args.out is not None:
        args.out.write_text(json.dumps(effect, indent=1) + "\n")
    return effect


if __name__ == "__main__":
    main()
