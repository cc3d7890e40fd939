"""Static QDQ, static QOperator and dynamic int8 side by side, on the same prepared model.

For each model: the int8/fp32 speed-up (paired timing against the user's unprepared model, one
thread) and the output error (noise-to-signal ratio on the calibration feeds) of

- ``static``: the reference configuration, Q/DQ around the compute-heavy operators (the package);
- ``qoperator``: the same ranges and operators in onnxruntime's QOperator format (QLinearConv,
  QLinearMatMul; built here with onnxruntime's quantizer, the package has no such approach);
- ``static+inc_ops`` and ``qoperator+inc_ops``: the same ranges in each format around Intel
  Neural Compressor's pick on the PP-OCRv4 recognizer, every operator of onnxruntime's QDQ and
  QLinear registries but Add and Mul (docs/real-models.md, "Peers"): which of INC's format and
  operator set makes its model faster;
- ``dynamic``: the package's dynamic approach (DynamicQuantizeLinear + MatMulInteger on the
  MatMuls with constant weights, and Attention/LSTM);
- ``dynamic+conv``: the same with ConvInteger for the convolutions;
- ``quantize_dynamic``: onnxruntime's ``quantize_dynamic`` defaults (every IntegerOps operator:
  also Gather, Transpose), per tensor.

Run::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python -m benchmarks.bench_approaches minilm demo rapidocr_rec silero_vad_sequence

Results go to ``benchmarks/results/approaches.json``, one entry per model and CPU int8 class
(``name@class``; the entries named by the model alone are from the AMD Zen 5 machine, ``x86-vnni``),
merged with earlier runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from collections.abc import Sequence
import copy
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantizationMode
from onnxruntime.quantization import QuantType
from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
from onnxruntime.quantization.qdq_quantizer import QDQQuantizer
from onnxruntime.quantization.registry import IntegerOpsRegistry

from benchmarks._versions import versions
from benchmarks.bench_prepare import _model_and_feeds
from optuna_quant.measure.latency import BenchmarkSettings
from optuna_quant.measure.latency import measure_latency
from optuna_quant.measure.sensitivity import output_error
from optuna_quant.quantization.config import DYNAMIC_OP_TYPES
from optuna_quant.quantization.config import op_type_sets
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.prepare import prepare_model
from optuna_quant.quantization.quantize import Quantizer


RESULTS = Path(__file__).parent / "results" / "approaches.json"
TIMING = BenchmarkSettings(threads=1, warmup=5, blocks=10, min_seconds=3.0)
CALIBRATION_FEEDS = 16


INC_OP_TYPES = tuple(op for op in op_type_sets()["all"] if op not in ("Add", "Mul"))
"""Intel Neural Compressor's operator set on the PP-OCRv4 recognizer."""


def _onnx_quantizer(model: onnx.ModelProto, **kwargs) -> onnx.ModelProto:
    quantizer = ONNXQuantizer(copy.deepcopy(model), **kwargs)
    quantizer.quantize_model()
    return quantizer.model.model


def _static(quantizer: Quantizer, op_types: Sequence[str], qoperator: bool) -> onnx.ModelProto:
    """onnxruntime's static quantization of ``op_types`` from the package's MinMax ranges, per
    channel, in the QOperator or the Q/DQ format."""
    kwargs = dict(
        per_channel=True, reduce_range=False, weight_qType=QuantType.QInt8, activation_qType=QuantType.QUInt8,
        tensors_range=copy.deepcopy(quantizer.ranges("minmax")), nodes_to_quantize=[],
        nodes_to_exclude=list(quantizer.kept_fp32), op_types_to_quantize=list(op_types),
        extra_options={"WeightSymmetric": True},
    )
    if qoperator:
        return _onnx_quantizer(quantizer._model, mode=QuantizationMode.QLinearOps, static=True, **kwargs)
    qdq = QDQQuantizer(copy.deepcopy(quantizer._model), **kwargs)
    qdq.quantize_model()
    return qdq.model.model


def _integer_ops(quantizer: Quantizer, op_types: Sequence[str], per_channel: bool) -> onnx.ModelProto:
    """onnxruntime's dynamic quantization of ``op_types`` (MatMuls with constant weights only)."""
    return _onnx_quantizer(
        quantizer._model,
        per_channel=per_channel, reduce_range=False, mode=QuantizationMode.IntegerOps, static=False,
        weight_qType=QuantType.QInt8, activation_qType=QuantType.QUInt8, tensors_range=None,
        nodes_to_quantize=[], nodes_to_exclude=[], op_types_to_quantize=list(op_types),
        extra_options={"MatMulConstBOnly": True, "WeightSymmetric": True},
    )


BUILDERS: dict[str, Callable[[Quantizer], onnx.ModelProto]] = {
    "static": lambda q: q.quantize(QuantConfig()),
    "qoperator": lambda q: _static(q, op_type_sets()["compute"], qoperator=True),
    "static+inc_ops": lambda q: _static(q, INC_OP_TYPES, qoperator=False),
    "qoperator+inc_ops": lambda q: _static(q, INC_OP_TYPES, qoperator=True),
    "dynamic": lambda q: q.quantize(QuantConfig(approach="dynamic")),
    "dynamic+conv": lambda q: _integer_ops(q, [*DYNAMIC_OP_TYPES, "Conv"], per_channel=True),
    "quantize_dynamic": lambda q: _integer_ops(q, list(IntegerOpsRegistry), per_channel=False),
}


def _minilm(count: int) -> tuple[Path, list[dict[str, np.ndarray]]]:
    from examples.bert import minilm
    from examples.bert import sentence_feeds
    from examples.bert import SENTENCES

    return minilm(), sentence_feeds(SENTENCES[: 2 * count])[:count]


def measure(name: str) -> dict[str, dict[str, float]]:
    """Every approach's speed-up and output error on model ``name``."""
    path, feeds = _minilm(CALIBRATION_FEEDS) if name == "minilm" else _model_and_feeds(name, CALIBRATION_FEEDS)
    prepared = prepare_model(path, feeds)
    quantizer = Quantizer(prepared.prepared, feeds)
    options = TIMING.session_options()
    fp32 = ort.InferenceSession(prepared.original.SerializeToString(), options, providers=["CPUExecutionProvider"])
    reference = [fp32.run(None, feed) for feed in feeds]
    results = {}
    for approach, build in BUILDERS.items():
        try:
            int8 = ort.InferenceSession(build(quantizer).SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception as err:  # noqa: BLE001 - an approach this model cannot take is a result
            results[approach] = {"failure": f"{type(err).__name__}: {err}"[:200]}
            print(f"{name:20s} {approach:17s} failed: {results[approach]['failure']}", flush=True)
            continue
        latency = measure_latency(fp32, int8, feeds[0], TIMING)
        error = output_error(reference, [int8.run(None, feed) for feed in feeds])
        results[approach] = {"lat_diff": latency.lat_diff, "spread": latency.spread, "error": error}
        print(f"{name:20s} {approach:17s} lat_diff {latency.lat_diff:.3f} (spread {latency.spread:.3f}) error {error:.4f}", flush=True)
    return results


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="minilm, demo or a name of optuna_quant.testing.shipped.SHIPPED")
    parser.add_argument("--json", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    stored = json.loads(args.json.read_text()) if args.json.is_file() else {}
    for name in args.models:
        ran_with = versions()
        stored[f"{name}@{ran_with['int8_class']}"] = {"results": measure(name), "versions": ran_with}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
