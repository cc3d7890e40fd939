"""Trial cost: quantization from cached calibration against ``quantize_static``, and its share of a trial.

For each of several configurations of the demo model, side by side in one run and in alternating
order: the cached step (:meth:`Quantizer.quantize`, calibration already collected) and
onnxruntime's ``quantize_static`` from scratch (it calibrates on every call). Then whole trials
(:meth:`QuantizationObjective.measure`) show what share of a trial quantization takes.

Run::

    python -m benchmarks.bench_trial_cost [--configs 8] [--seed 0]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import contextlib
import io
import json
import logging
from pathlib import Path
import random
import statistics
import tempfile
import time

from onnxruntime.quantization import QuantFormat
from onnxruntime.quantization import quantize_static
from onnxruntime.quantization import QuantType

from benchmarks._demo_setup import demo_objective
from benchmarks._versions import versions
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.quantize import _family
from optuna_quant.quantization.quantize import _percentile


def quantize_static_from_scratch(objective, config: QuantConfig, out: Path) -> None:
    """onnxruntime's one-call path with the same settings as the cached step.

    The calibration method, its bins and its percentile come from the quantizer's own mapping,
    so that the two paths cannot drift apart.
    """
    method, calibrator_options = _family(config.range_estimator)
    extra: dict[str, object] = {"ActivationSymmetric": config.symmetric, "WeightSymmetric": config.symmetric}
    if "num_bins" in calibrator_options:
        extra["CalibNumBins"] = calibrator_options["num_bins"]
    percentile = _percentile(config.range_estimator)
    if percentile is not None:
        extra["CalibPercentile"] = percentile
    with contextlib.redirect_stdout(io.StringIO()):
        quantize_static(
            str(objective.measurer.quantizer.model_path),
            str(out),
            objective.measurer.quantizer.calibration_reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=config.per_channel,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=sorted(config.fallback),
            calibrate_method=method,
            extra_options=extra,
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.getLogger("root").setLevel(logging.ERROR)

    objective = demo_objective()
    rng = random.Random(args.seed)
    distributions = objective.space.distributions()
    # Entropy calibration alone takes seconds per quantize_static call; the cached path pays it once.
    configs = []
    for _ in range(args.configs):
        params = {name: rng.choice(d.choices) for name, d in distributions.items()}
        configs.append(params)
    for params in configs:  # collect every calibration once, as a study does in its first trials
        objective.measurer.quantizer.quantize(objective.space.to_config(params))

    cached, scratch = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, params in enumerate(configs):
            config = objective.space.to_config(params)
            steps = [("cached", lambda: objective.measurer.quantizer.quantize(config)),
                     ("scratch", lambda: quantize_static_from_scratch(objective, config, Path(tmp) / "q.onnx"))]
            if i % 2:
                steps.reverse()
            for name, step in steps:
                start = time.perf_counter()
                step()
                (cached if name == "cached" else scratch).append(time.perf_counter() - start)

    trials = [objective.measure(params) for params in configs]
    shares = [t.quantize_seconds / (t.quantize_seconds + t.eval_seconds + t.latency_seconds) for t in trials]
    ratios = [s / c for s, c in zip(scratch, cached)]

    print(f"{'config':>6} {'range_estimator':>18} {'cached ms':>10} {'static ms':>10} {'ratio':>7} {'quant share':>11}")
    for i, params in enumerate(configs):
        print(f"{i:>6} {params['range_estimator']:>18} {cached[i] * 1e3:>10.1f} {scratch[i] * 1e3:>10.1f} "
              f"{ratios[i]:>7.1f} {shares[i]:>10.1%}")
    summary = {
        "median_cached_ms": statistics.median(cached) * 1e3,
        "median_quantize_static_ms": statistics.median(scratch) * 1e3,
        "median_ratio": statistics.median(ratios),
        "min_ratio": min(ratios),
        "median_quantize_share_of_trial": statistics.median(shares),
        "max_quantize_share_of_trial": max(shares),
        "median_trial_s": statistics.median(
            t.quantize_seconds + t.eval_seconds + t.latency_seconds for t in trials
        ),
        "calibration_s_once": objective.measurer.quantizer.calibration_seconds,
    }
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({**summary, "versions": versions()}, indent=2))


if __name__ == "__main__":
    main()
