"""Each searchable layer of a real model timed as the study's sensitivity times it, on two inputs.

For one model of :mod:`benchmarks.real_models.workloads`, at a configuration of its space (the
default, with ``--params`` overrides), :func:`optuna_quant.measure.sensitivity.measure_sensitivity` runs
``--repeats`` times on each of two inputs: the first calibration feed (what the sensitivity timed
before be69d5f) and the study's latency feed (what it times now, and what the trials are timed
on). Per layer it prints ``revert_cost`` (the share of the all-int8 speed-up that keeping only
that layer in fp32 loses) and ``alone_speedup`` (the fp32 model over the model with only that
layer int8). docs/real-models.md quotes these figures for silero_vad and mtcnn_onet.

Example::

    .venv/bin/python -m benchmarks.real_models.layer_timing --model silero_vad --params range_estimator=entropy
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict
import logging
import os
import sys
import tempfile


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import optuna  # noqa: E402

from benchmarks.real_models.run import ACCURACY_LOSS  # noqa: E402
from benchmarks.real_models.run import SETTINGS  # noqa: E402
from benchmarks.real_models.workloads import build  # noqa: E402
from benchmarks.real_models.workloads import LATENCY_TARGETS  # noqa: E402
from benchmarks.real_models.workloads import WORKLOADS  # noqa: E402
import optuna_quant  # noqa: E402
from optuna_quant.measure.sensitivity import measure_sensitivity  # noqa: E402


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.real_models.layer_timing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(WORKLOADS))
    parser.add_argument("--params", nargs="*", default=[], metavar="NAME=CHOICE", help="overrides of the space's default")
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.basicConfig(level=logging.WARNING)
    workload = build(args.model)
    with tempfile.TemporaryDirectory() as folder:
        study = optuna_quant.create_study(
            **workload.study_kwargs(),
            accuracy_loss=ACCURACY_LOSS,
            latency_reduce=LATENCY_TARGETS[args.model],
            storage=optuna.storages.InMemoryStorage(),
            benchmark=asdict(SETTINGS),
            artifact_dir=folder,
            sensitivity=False,
        )
    objective = study.objective
    space = objective.space
    params = dict(item.split("=", 1) for item in args.params)
    base = space.to_config({**space.default_params(), **params})
    inputs = {"first calibration feed": objective.measurer.feeds[0], "latency feed": objective.measurer.latency_feed}
    readings: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for name, feed in inputs.items():
        for _ in range(args.repeats):
            sens = measure_sensitivity(
                objective.measurer.prepared.prepared, objective.measurer.quantizer, objective.measurer.feeds, space.nodes,
                base_config=base, settings=objective.measurer.benchmark, timing_feed=feed,
            )
            for node, s in sens.items():
                readings.setdefault(node, {}).setdefault(name, []).append((s.revert_cost, s.alone_speedup))
    rows = {name: len(next(iter(feed.values()))) for name, feed in inputs.items()}
    print(f"{args.model} at {params or 'the default'}; {args.repeats} runs on each input ({rows} rows)")
    print("| layer | " + " | ".join(f"revert_cost, {n} | alone_speedup, {n}" for n in inputs) + " |")
    print("|---" * (1 + 2 * len(inputs)) + "|")
    for node, by_input in readings.items():
        cells = []
        for name in inputs:
            costs, speedups = zip(*by_input[name])
            cells += [", ".join(f"{c:+.3f}" for c in costs), ", ".join(f"{v:.3f}" for v in speedups)]
        print(f"| {node} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
