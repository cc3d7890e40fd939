"""How well per-layer sensitivity predicts the accuracy loss and speed-up of configurations (demo model).

:func:`optuna_quant.measure.sensitivity.measure_sensitivity` runs once on the demo objective's model and
calibration data. Then every fallback set of the ``layer`` scope (``--configs`` of them drawn at
random when there are more; the other scopes at the reference's choice) is built and measured
by the objective (``acc_loss`` on the 1,500 test digits, ``lat_diff`` by the paired timing). Each
sensitivity figure predicts a configuration's error by adding up its layers' figures:

- ``alone``: the sum of ``error_alone`` over the layers it keeps int8;
- ``recovered``: the all-int8 error less the sum of ``error_recovered`` over the layers it keeps in fp32.

The figure of merit is Spearman's rank correlation between each prediction and the measured
``acc_loss``; the measured output error of each configuration on the calibration samples (what
the predictions add up to) is shown beside them. Two time figures are correlated with the
measured ``lat_diff`` alike: the profiled time saved by the layers a configuration keeps int8
(the sum of ``time_saved_ms``), and the speed-up kept when the layers it keeps in fp32 are
reverted (one less the sum of their timed ``revert_cost``).

Run::

    python -m benchmarks.bench_sensitivity [--configs 32] [--seed 0] [--json out.json]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import itertools
import json
import logging
import os
from pathlib import Path
import random
import time


os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import onnxruntime as ort  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

from benchmarks._demo_setup import demo_objective  # noqa: E402
from examples import demo_data  # noqa: E402
from optuna_quant.measure.sensitivity import measure_sensitivity  # noqa: E402
from optuna_quant.measure.sensitivity import output_error  # noqa: E402
from optuna_quant.quantization.model_io import to_feeds  # noqa: E402
from optuna_quant.trial.space import LAYER_PREFIX  # noqa: E402


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=32, help="fallback sets to measure, at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the measurements to this file")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    objective = demo_objective()
    nodes = objective.space.nodes
    feeds = to_feeds(demo_data.calibration(), objective.measurer.model)
    start = time.perf_counter()
    sens = measure_sensitivity(objective.measurer.model, objective.measurer.quantizer, feeds, nodes)
    seconds = time.perf_counter() - start
    samples = feeds[:32]  # measure_sensitivity's default n_samples
    options = objective.measurer.benchmark.session_options()

    def outputs(model_bytes: bytes) -> list:
        session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        return [session.run(None, feed) for feed in samples]

    reference = outputs(objective.measurer.model.SerializeToString())
    fallbacks = [frozenset(c) for r in range(len(nodes) + 1) for c in itertools.combinations(nodes, r)]
    if len(fallbacks) > args.configs:
        fallbacks = random.Random(args.seed).sample(fallbacks, args.configs)
    base_error = output_error(reference, outputs(objective.build(objective.space.default_params()).SerializeToString()))
    rows = []
    for fallback in fallbacks:
        params = {**objective.space.default_params(), **{LAYER_PREFIX + n: "fp32" for n in fallback}}
        measurement = objective.measure(params)
        rows.append(
            {
                "fallback": sorted(fallback),
                "acc_loss": measurement.acc_loss,
                "lat_diff": measurement.lat_diff,
                "output_error": output_error(reference, outputs(objective.build(params).SerializeToString())),
                "alone": sum(sens[n].error_alone for n in nodes if n not in fallback),
                "recovered": base_error - sum(sens[n].error_recovered for n in fallback),
                "time_saved_ms": sum(sens[n].time_saved_ms for n in nodes if n not in fallback),
                "speed_kept": 1.0 - sum(sens[n].revert_cost for n in fallback),
            }
        )
    acc = [r["acc_loss"] for r in rows]
    summary = {
        "configs": len(rows),
        "sensitivity_seconds": seconds,
        "spearman_alone": spearmanr([r["alone"] for r in rows], acc).statistic,
        "spearman_recovered": spearmanr([r["recovered"] for r in rows], acc).statistic,
        "spearman_output_error": spearmanr([r["output_error"] for r in rows], acc).statistic,
        "spearman_time_saved_lat_diff": spearmanr([r["time_saved_ms"] for r in rows], [r["lat_diff"] for r in rows]).statistic,
        "spearman_speed_kept_lat_diff": spearmanr([r["speed_kept"] for r in rows], [r["lat_diff"] for r in rows]).statistic,
    }
    print("| layer | error alone | error recovered | fp32 ms | int8 ms | saved ms | revert cost |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for node, s in sens.items():
        print(
            f"| {node} | {s.error_alone:.3g} | {s.error_recovered:.3g} | {s.fp32_ms:.3f} | {s.int8_ms:.3f} "
            f"| {s.time_saved_ms:.3f} | {s.revert_cost:.3f} |"
        )
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(
            json.dumps({"summary": summary, "sensitivity": {n: s.to_dict() for n, s in sens.items()}, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
