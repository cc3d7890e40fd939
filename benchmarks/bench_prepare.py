"""What preparation, the op_types choice and chunked calibration do on models as they ship.

For each model of :data:`optuna_quant.testing.shipped.SHIPPED` that is installed (and the demo
model): opset and node count before and after :func:`optuna_quant.quantization.prepare.prepare_model`; the
reference configuration's int8/fp32 speed-up (paired timing against the user's unprepared model)
and output error, with ``quant_pre_process`` on and off and for each ``op_types`` choice; the
one-off calibration time of each method; and the peak memory (MB, before and after
calibrating) of a process that calibrates on 4 and on 32 samples. Run::

    OPENBLAS_NUM_THREADS=1 python -m benchmarks.bench_prepare rapidocr_rec rapidocr_cls ddddocr_rec silero_vad_sequence demo

Results go to ``benchmarks/results/prepare.json`` (one entry per model, merged with earlier runs).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import json
import logging
from pathlib import Path
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks._versions import versions
from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.measure.latency import measure_latency
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.model_io import opset_of
from optuna_quant.quantization.model_io import to_feeds
from optuna_quant.quantization.prepare import prepare_model
from optuna_quant.quantization.quantize import Quantizer
from optuna_quant.testing.shipped import SHIPPED
from optuna_quant.trial.space import SearchSpace


RESULTS = Path(__file__).parent / "results" / "prepare.json"
TIMING = BenchmarkSettings(threads=1, warmup=3, blocks=6, min_seconds=2.0)
CALIBRATION_FEEDS = 16
METHODS = ("minmax", "entropy", "percentile_99.99")


def _model_and_feeds(name: str, count: int) -> tuple[Path, list[dict[str, np.ndarray]]]:
    if name == "demo":
        from examples.demo_data import calibration
        from examples.demo_model import build_demo_model

        path = build_demo_model()
        return path, to_feeds(calibration()[:count], onnx.load(str(path)))
    shipped = SHIPPED[name]
    path = shipped.path()
    if path is None:
        raise SystemExit(f"{name}: package {shipped.package!r} is not installed")
    return path, shipped.feeds(count)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), TIMING.session_options(), providers=["CPUExecutionProvider"])


def _relative_error(fp32: ort.InferenceSession, int8: ort.InferenceSession, feeds: list) -> float:
    """RMS error of the first output over ``feeds``, relative to the fp32 output's RMS."""
    errors, norms = [], []
    for feed in feeds:
        want, got = fp32.run(None, feed)[0], int8.run(None, feed)[0]
        errors.append(np.mean((got - want) ** 2))
        norms.append(np.mean(want**2))
    return float(np.sqrt(np.mean(errors) / np.mean(norms)))


def _peak_rss_mb(name: str, method: str, count: int) -> list[float]:
    """Peak RSS (MB) of a fresh process before and after it calibrates ``method`` on ``count`` feeds."""
    code = f"from benchmarks.bench_prepare import _calibrate_only; _calibrate_only({name!r}, {method!r}, {count})"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return [round(int(kb) / 1024, 1) for kb in out.stdout.split()[-2:]]


def _prepared_file(name: str) -> Path:
    """The prepared model of ``name``, written once by another process (preparation's own peak
    would hide calibration's)."""
    path = Path(tempfile.gettempdir()) / f"optuna-quant-bench-prepared-{name}.onnx"
    if not path.exists():
        code = (
            "import onnx; from benchmarks.bench_prepare import _model_and_feeds; "
            "from optuna_quant.quantization.prepare import prepare_model; "
            f"model, feeds = _model_and_feeds({name!r}, 1); "
            f"onnx.save(prepare_model(model, feeds).prepared, {str(path)!r})"
        )
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return path


def _peak_kb() -> int:
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent process.
    return int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))


def _calibrate_only(name: str, method: str, count: int) -> None:
    prepared = _prepared_file(name)
    _, feeds = _model_and_feeds(name, count)
    quantizer = Quantizer(onnx.load(str(prepared)), feeds)
    print(_peak_kb())
    quantizer.ranges(method)
    print(_peak_kb())


def bench(name: str, memory_counts: tuple[int, ...]) -> dict:
    path, feeds = _model_and_feeds(name, CALIBRATION_FEEDS)
    result: dict = {"model": str(path.name)}
    fp32 = None
    for pre_process in (True, False):
        start = time.perf_counter()
        prepared = prepare_model(path, feeds, pre_process=pre_process)
        key = "pre_process" if pre_process else "no_pre_process"
        fp32 = fp32 or _session(prepared.original)
        entry = {
            "prepare_s": round(time.perf_counter() - start, 2),
            "steps": list(prepared.steps),
            "opset": [opset_of(prepared.original), opset_of(prepared.prepared)],
            "nodes": [len(prepared.original.graph.node), len(prepared.prepared.graph.node)],
        }
        space = SearchSpace.from_model(prepared.prepared)
        entry["layers"] = len(space.nodes)
        quantizer = Quantizer(prepared.prepared, feeds)
        if pre_process:
            entry["calibration_s"] = {}
            for method in METHODS:
                start = time.perf_counter()
                quantizer.ranges(method)
                entry["calibration_s"][method] = round(time.perf_counter() - start, 2)
        entry["reference"] = {}
        for op_types in space.op_types:
            int8 = _session(quantizer.quantize(QuantConfig(op_types=op_types)))
            latency = measure_latency(fp32, int8, feeds[0], TIMING)
            entry["reference"][op_types] = {
                "lat_diff": round(latency.lat_diff, 3),
                "spread": round(latency.spread, 3),
                "output_error": round(_relative_error(fp32, int8, feeds), 4),
            }
        result[key] = entry
        print(name, key, json.dumps(entry), flush=True)
    result["peak_rss_mb"] = {
        method: {count: _peak_rss_mb(name, method, count) for count in memory_counts}
        for method in ("minmax", "percentile_99.99")
    }
    print(name, "peak_rss_mb", result["peak_rss_mb"], flush=True)
    return result


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options (``sys.argv[1:]`` when ``argv`` is ``None``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help=f"names from {sorted(SHIPPED)} or 'demo'")
    parser.add_argument("--memory-counts", type=int, nargs="+", default=[4, 32])
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    stored = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for name in args.models:
        stored[name] = bench(name, tuple(args.memory_counts))
        stored[name]["versions"] = versions()
        RESULTS.write_text(json.dumps(stored, indent=1) + "\n")


if __name__ == "__main__":
    main()
