"""Whether a built model runs anything in int8, on models that already hold some."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnxruntime.quantization import CalibrationDataReader
from onnxruntime.quantization import QuantFormat
from onnxruntime.quantization import quantize_static

from optuna_quant.measure.evaluate import Top1Accuracy
from optuna_quant.measure.int8_causes import int8_nodes
from optuna_quant.measure.int8_causes import quantizes_anything
from optuna_quant.trial.objective import QuantizationObjective
from optuna_quant.trial.space import LAYER_PREFIX


class _Feeds(CalibrationDataReader):
    def __init__(self, name: str, batches: list[np.ndarray]) -> None:
        self._feeds = iter([{name: batch} for batch in batches])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def test_a_model_that_holds_qdq_already_is_not_quantized_by_keeping_every_layer_fp32(
    cnn: onnx.ModelProto, calib: list[np.ndarray], agreement: Top1Accuracy, tmp_path: Path
) -> None:
    """A QAT export or a partly quantized model holds Q/DQ pairs of its own: the configuration that
    keeps every layer in fp32 builds that model again, which is no int8 result of the study."""
    onnx.save(cnn, tmp_path / "fp32.onnx")
    first_conv = next(node.name for node in cnn.graph.node if node.op_type == "Conv")
    quantize_static(
        tmp_path / "fp32.onnx", tmp_path / "partly.onnx", _Feeds(cnn.graph.input[0].name, calib[:8]),
        quant_format=QuantFormat.QDQ, nodes_to_quantize=[first_conv],
    )
    partly = onnx.load(tmp_path / "partly.onnx")
    objective = QuantizationObjective(partly, calib[:8], agreement)
    space, measurer = objective.space, objective.measurer
    default = space.default_params()
    all_fp32 = {**default, **{LAYER_PREFIX + unit: "fp32" for unit in space.units()}}
    as_given = measurer.build(space.to_config(all_fp32))
    assert quantizes_anything(as_given)  # its own Q/DQ pairs ...
    assert not measurer.quantizes(as_given)  # ... are the model's, not the configuration's
    assert measurer.quantizes(measurer.build(space.to_config(default)))
    assert not quantizes_anything(cnn) and quantizes_anything(partly, int8_nodes(cnn))
