"""Dynamic int8 quantization: weights int8 ahead of time, each activation at run time.

onnxruntime's ``quantize_dynamic`` recipe, built in memory from a configuration: every MatMul
with constant weights becomes ``DynamicQuantizeLinear`` + ``MatMulInteger`` (which onnxruntime
fuses into ``DynamicQuantizeMatMul`` when it loads the model), Attention and LSTM their integer
forms. Activations are uint8, quantized with the range of the batch that runs: no calibration.
The configuration's fallback, granularity and weight mode apply; its range estimator, activation
mode and operator types do not (:func:`optuna_quant.quantization.config.effective_config`).

Example:
    >>> int8 = dynamic_model(model, QuantConfig(approach="dynamic"))   # doctest: +SKIP
    >>> {n.op_type for n in int8.graph.node} >= {"DynamicQuantizeLinear", "MatMulInteger"}  # doctest: +SKIP
    True
"""

from __future__ import annotations

import copy
from typing import Any

import onnx
from onnxruntime.quantization import QuantizationMode
from onnxruntime.quantization import QuantType
from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer

from optuna_quant.quantization.config import DYNAMIC_OP_TYPES
from optuna_quant.quantization.config import QuantConfig


def dynamic_model(model: onnx.ModelProto, config: QuantConfig) -> onnx.ModelProto:
    """The dynamic int8 model of ``config``, built by onnxruntime's ``ONNXQuantizer``.

    ``model`` needs value_info for its tensors (onnxruntime's ``load_model_with_shape_infer``);
    it is not changed.
    """
    quantizer = ONNXQuantizer(
        copy.deepcopy(model),
        config.per_channel,
        config.weight_type == "int7",  # reduce_range
        QuantizationMode.IntegerOps,
        False,  # static: no, activations are quantized at run time
        QuantType.QUInt8 if config.weight_type == "uint8" else QuantType.QInt8,
        QuantType.QUInt8,  # the only activation type of DynamicQuantizeLinear
        None,  # no calibrated ranges
        None,  # nodes_to_quantize: every node of the operator types ...
        sorted(config.fallback),  # ... except these
        list(DYNAMIC_OP_TYPES),
        {
            # A MatMul of two activations stays fp32, as in quantize_dynamic.
            "MatMulConstBOnly": True,
            "WeightSymmetric": config.weight_symmetric,
            "TensorQuantOverrides": {} if config.weight_symmetric else _symmetric_lstm_weights(model),
        },
    )
    quantizer.quantize_model()
    quantizer.model.topological_sort()
    return quantizer.model.model


def _symmetric_lstm_weights(model: onnx.ModelProto) -> dict[str, list[dict[str, Any]]]:
    """Overrides that keep every LSTM's weights symmetric: onnxruntime's ``DynamicQuantizeLSTM``
    refuses a weight zero point at run time ("InputWeight zero point must be zero"), while
    ``MatMulInteger`` takes the asymmetric weights that the configuration asks for."""
    initializers = {init.name for init in model.graph.initializer}
    return {
        name: [{"axis": 0, "symmetric": True}]
        for node in model.graph.node
        if node.op_type == "LSTM"
        for name in node.input[1:3]
        if name in initializers
    }
