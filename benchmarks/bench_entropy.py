"""Entropy calibration: onnxruntime's threshold search against optuna-quant's, on the same histograms.

For each real model, the Entropy histograms are collected once, as a study collects them (2048
bins, started over the MinMax ranges, one feed at a time), and the thresholds of every tensor are
searched by onnxruntime's ``HistogramCollector.get_entropy_threshold`` and by
:func:`optuna_quant.quantization.entropy.entropy_threshold`, alternating per tensor. Printed per
model: the tensors, the seconds collecting the histograms, each search's seconds, and whether
every threshold is the same to the bit (the run fails if one is not).

Run::

    .venv/bin/python -m benchmarks.bench_entropy --models silero_vad ddddocr ppocr minilm --json benchmarks/results/entropy_search.json
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import json
import logging
from pathlib import Path
import tempfile
import time
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationMethod
from onnxruntime.quantization.calibrate import create_calibrator
from onnxruntime.quantization.calibrate import HistogramCollector

from benchmarks.real_models.workloads import build
from benchmarks.real_models.workloads import WORKLOADS
from optuna_quant.measure.cpu import int8_support
from optuna_quant.quantization.entropy import entropy_threshold
from optuna_quant.quantization.model_io import load_model
from optuna_quant.quantization.model_io import to_feeds
from optuna_quant.quantization.prepare import prepare_model
from optuna_quant.quantization.quantize import collect
from optuna_quant.quantization.quantize import ENTROPY_NUM_BINS
from optuna_quant.quantization.quantize import Quantizer
from optuna_quant.quantization.quantize import seed_histograms


def measure(name: str) -> dict[str, Any]:
    """Collect ``name``'s Entropy histograms once and search their thresholds both ways."""
    workload = build(name)
    kwargs = workload.study_kwargs()
    if not isinstance(kwargs["model"], (str, Path, onnx.ModelProto)):
        raise SystemExit(f"{name}: its model is a {type(kwargs['model']).__name__}, not an ONNX model.")
    model = load_model(kwargs["model"])
    prepared = prepare_model(model, to_feeds(kwargs["calibration_data"], model))
    feeds = to_feeds(kwargs["calibration_data"], prepared.prepared)
    quantizer = Quantizer(prepared.prepared, feeds, shapes_inferred=prepared.shapes_inferred)
    with tempfile.TemporaryDirectory() as folder:
        calibrator = create_calibrator(
            quantizer.model_path,
            augmented_model_path=str(Path(folder) / "augmented.onnx"),
            calibrate_method=CalibrationMethod.Entropy,
            extra_options={"num_bins": ENTROPY_NUM_BINS},
        )
        minmax = quantizer.ranges("minmax")
        start = time.perf_counter()
        calibrator.tensors_to_calibrate &= set(minmax.data)  # no histogram spans a fill, as in a study
        seed_histograms(calibrator, minmax)
        collect(calibrator, feeds, "Entropy")
        collect_s = time.perf_counter() - start
    collector, bins = calibrator.collector, calibrator.num_quantized_bins
    seconds = {"onnxruntime": 0.0, "optuna_quant": 0.0}
    differ = []
    for tensor, histogram in collector.histogram_dict.items():
        start = time.perf_counter()
        theirs = HistogramCollector.get_entropy_threshold(collector, histogram, bins)
        seconds["onnxruntime"] += time.perf_counter() - start
        start = time.perf_counter()
        ours = entropy_threshold(histogram, bins)
        seconds["optuna_quant"] += time.perf_counter() - start
        if [np.asarray(v).tobytes() for v in ours] != [np.asarray(v).tobytes() for v in theirs]:
            differ.append(tensor)
    return {
        "model": name,
        "tensors": len(collector.histogram_dict),
        "collect_s": collect_s,
        "search_s": seconds,
        "speedup": seconds["onnxruntime"] / seconds["optuna_quant"],
        "differ": differ,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line of the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(WORKLOADS), default=["silero_vad", "ddddocr", "ppocr", "minilm"])
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rows = [measure(name) for name in args.models]
    print(f"CPU int8 class {int8_support().int8_class}")
    print("| model | tensors | collection s | onnxruntime's search s | ours s | speed-up | thresholds |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        same = "identical" if not row["differ"] else f"{len(row['differ'])} differ"
        search = row["search_s"]
        print(
            f"| {row['model']} | {row['tensors']} | {row['collect_s']:.1f} | {search['onnxruntime']:.1f} | "
            f"{search['optuna_quant']:.1f} | {row['speedup']:.1f}x | {same} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"cpu": int8_support().int8_class, "rows": rows}, indent=2) + "\n")
    if any(row["differ"] for row in rows):
        raise SystemExit("Some thresholds differ from onnxruntime's.")


if __name__ == "__main__":
    main()
