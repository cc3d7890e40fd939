from __future__ import annotations

from collections import Counter
import warnings

import numpy as np
import pytest


torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
from onnx import numpy_helper  # noqa: E402
from torch import nn  # noqa: E402

from optuna_quant.qat import calibrate  # noqa: E402
from optuna_quant.qat import export_qat  # noqa: E402
from optuna_quant.qat import named_quantizers  # noqa: E402
from optuna_quant.qat import QuantConv2d  # noqa: E402
from optuna_quant.qat import quantize_modules  # noqa: E402
from optuna_quant.qat import QuantLinear  # noqa: E402
from optuna_quant.qat import TensorQuantizer  # noqa: E402
from optuna_quant.qat import UncalibratedQuantizerError  # noqa: E402


torch.set_num_threads(1)


def cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Conv2d(4, 8, 3, groups=2),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 10),
    )


def calibrated_cnn() -> tuple[nn.Sequential, torch.Tensor]:
    model = quantize_modules(cnn())
    batches = [torch.randn(8, 1, 8, 8) for _ in range(3)]
    calibrate(model, batches)
    return model.eval(), torch.cat(batches)


def calibrated(quantizer: TensorQuantizer, data: torch.Tensor) -> TensorQuantizer:
    quantizer.enable_calib()
    quantizer(data)
    quantizer.load_calib_amax()
    quantizer.disable_calib()
    return quantizer


def test_quantize_modules_swaps_in_place_and_shares_weights() -> None:
    model = cnn()
    weights = [model[0].weight, model[3].weight, model[5].weight]
    assert quantize_modules(model) is model
    assert [type(m) for m in model] == [
        QuantConv2d, nn.BatchNorm2d, nn.ReLU, QuantConv2d, nn.Flatten, QuantLinear
    ]
    assert [model[0].weight, model[3].weight, model[5].weight] == weights
    assert (model[3].groups, model[3].kernel_size) == (2, (3, 3))
    assert model[0].weight_quantizer.axis == 0 and model[0].input_quantizer.axis is None


def test_quantize_modules_replaces_a_bare_layer_and_rejects_non_modules() -> None:
    layer = nn.Linear(3, 2)
    quant = quantize_modules(layer)
    assert isinstance(quant, QuantLinear) and quant.weight is layer.weight
    with pytest.raises(TypeError, match="torch.nn.Module"):
        quantize_modules("model")  # type: ignore[arg-type]


def test_quant_layers_match_float_layers_with_quantizers_off() -> None:
    model, x = calibrated_cnn()
    reference = cnn().eval()
    for quantizer in model.modules():
        if isinstance(quantizer, TensorQuantizer):
            quantizer.disable()
    assert torch.equal(model(x), reference(x))


def test_uncalibrated_quantizer_raises_a_clear_error() -> None:
    with pytest.raises(UncalibratedQuantizerError, match="no amax: calibrate it"):
        QuantLinear(3, 2)(torch.randn(1, 3))
    with pytest.raises(UncalibratedQuantizerError, match="no recorded range"):
        TensorQuantizer().load_calib_amax()


def test_disabled_quantizer_passes_through_without_amax() -> None:
    quantizer = TensorQuantizer()
    quantizer.disable()
    x = torch.randn(5)
    assert quantizer(x) is x


def test_calibrate_records_max_abs_per_tensor_and_per_channel() -> None:
    model = quantize_modules(cnn())
    model.train()
    batches = [torch.randn(4, 1, 8, 8), 3 * torch.randn(4, 1, 8, 8)]
    calibrate(model, batches)
    assert model.training
    assert torch.equal(model[0].input_quantizer.amax, torch.cat(batches).abs().amax())
    assert torch.equal(model[0].weight_quantizer.amax, model[0].weight.abs().amax(dim=(1, 2, 3)))
    assert model[5].weight_quantizer.amax.shape == (10,)
    # Eval mode while calibrating: BatchNorm's running statistics are untouched.
    assert torch.equal(model[1].running_mean, torch.zeros(4))


def test_calibrate_makes_quantizers_of_nonnegative_data_unsigned() -> None:
    model = quantize_modules(cnn())
    calibrate(model, [torch.randn(4, 1, 8, 8)])
    signs = {name: q.unsigned for name, q in named_quantizers(model).items()}
    # Only conv 3's input comes out of a ReLU.
    assert [name for name, unsigned in signs.items() if unsigned] == ["3.input_quantizer"]
    assert model[3].input_quantizer.bound == 255

    model = quantize_modules(cnn())
    calibrate(model, [torch.randn(4, 1, 8, 8)], unsigned_if_nonnegative=False)
    assert not any(q.unsigned for q in named_quantizers(model).values())


class WithUnusedLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(2, 2)
        self.unused = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def test_calibrate_names_quantizers_that_saw_no_data() -> None:
    model = quantize_modules(WithUnusedLayer())
    with pytest.raises(UncalibratedQuantizerError, match="unused.input_quantizer"):
        calibrate(model, [torch.randn(2, 2)])
    with pytest.raises(ValueError, match="quantize_modules"):
        calibrate(nn.Linear(2, 2), [torch.randn(2, 2)])


def test_per_tensor_fake_quantization_values() -> None:
    quantizer = calibrated(TensorQuantizer(), torch.tensor([-0.5, 1.27]))
    x = torch.tensor([0.013, -0.004, 2.0, -2.0])
    assert torch.allclose(quantizer(x), torch.tensor([0.01, 0.0, 1.27, -1.27]))
    quantizer.narrow_range = False
    assert torch.allclose(quantizer(x)[3], torch.tensor(-1.28))
    unsigned = calibrated(TensorQuantizer(unsigned=True), torch.tensor([2.55]))
    expected = torch.tensor([0.0, 0.01, 2.55])
    assert torch.allclose(unsigned(torch.tensor([-1.0, 0.014, 9.0])), expected)


def test_per_channel_fake_quantization_uses_one_scale_per_channel() -> None:
    weight = torch.tensor([[0.45, -1.0, 0.3], [0.01, 0.025, -0.04]])
    quantizer = calibrated(TensorQuantizer(axis=0), weight)
    assert torch.equal(quantizer.amax, torch.tensor([1.0, 0.04]))
    scale = quantizer.amax.reshape(-1, 1) / 127
    assert torch.allclose(quantizer(weight), torch.round(weight / scale) * scale)
    quantizer.fake_quant = False
    assert torch.equal(quantizer(weight), torch.round(weight / scale))


def test_real_quantization_gives_the_codes_of_fake_quantization() -> None:
    torch.manual_seed(1)
    data = torch.randn(64, 3)
    quantizer = calibrated(TensorQuantizer(axis=1), data)
    fake = quantizer(data)
    quantizer.fake_quant = False
    codes = quantizer(data)
    assert torch.equal(codes, codes.round()) and codes.abs().max() == 127
    assert torch.allclose(codes * quantizer.amax / 127, fake)


def test_straight_through_gradient() -> None:
    quantizer = calibrated(TensorQuantizer(), torch.tensor([1.0]))
    x = torch.tensor([-0.3, 0.2, 0.999, 1.5, -2.0], requires_grad=True)
    upstream = torch.tensor([0.5, -2.0, 3.0, 4.0, 5.0])
    quantizer(x).backward(upstream)
    assert torch.equal(x.grad, torch.tensor([0.5, -2.0, 3.0, 0.0, 0.0]))


def test_gradients_reach_the_weights_through_the_weight_quantizer() -> None:
    model, x = calibrated_cnn()
    model.train()
    model(x).square().mean().backward()
    for layer in (model[0], model[3], model[5]):
        assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0
        assert layer.weight_quantizer.amax.grad is None


def test_state_dict_round_trip_restores_amax() -> None:
    model, x = calibrated_cnn()
    fresh = quantize_modules(cnn()).eval()
    fresh.load_state_dict(model.state_dict())
    assert torch.equal(fresh[3].weight_quantizer.amax, model[3].weight_quantizer.amax)
    assert fresh[3].input_quantizer.unsigned
    assert torch.equal(fresh(x), model(x))


def run_onnx(onnx_model: object, x: np.ndarray, optimize: bool = True) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        onnx_model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def test_export_qat_gives_a_qdq_model_that_onnxruntime_runs(tmp_path) -> None:
    model, x = calibrated_cnn()
    path = tmp_path / "qat.onnx"
    model.train()  # export runs in eval mode and must give the training mode back
    onnx_model = export_qat(model, x[:2], path)
    assert model.training is True
    model.eval()
    assert path.exists()
    assert onnx_model.opset_import[0].version == 18
    ops = Counter(node.op_type for node in onnx_model.graph.node)
    assert ops["QuantizeLinear"] == ops["DequantizeLinear"] == 6

    initializers = {init.name: numpy_helper.to_array(init) for init in onnx_model.graph.initializer}
    per_channel = [
        initializers[node.input[1]]
        for node in onnx_model.graph.node
        if node.op_type == "QuantizeLinear" and initializers[node.input[1]].ndim == 1
    ]
    assert [scale.shape for scale in per_channel] == [(4,), (8,), (10,)]
    zero_point_types = [
        initializers[node.input[2]].dtype.name
        for node in onnx_model.graph.node
        if node.op_type == "QuantizeLinear" and initializers[node.input[1]].ndim == 0
    ]
    assert zero_point_types == ["int8", "uint8", "int8"]  # conv 3's input is unsigned
    assert np.allclose(per_channel[0], model[0].weight_quantizer.amax.numpy() / 127)

    # A batch size other than the example's: the batch dimension is symbolic.
    expected = model(x).detach().numpy()
    # Without graph optimizations onnxruntime computes exactly torch's fake quantization ...
    assert np.allclose(run_onnx(onnx_model, x.numpy(), optimize=False), expected, atol=1e-5)
    # ... with them it fuses QDQ into int8 kernels, which round intermediate results.
    assert np.abs(run_onnx(onnx_model, x.numpy()) - expected).max() < 0.02 * np.abs(expected).max()


def test_export_qat_refuses_uncalibrated_or_calibrating_quantizers() -> None:
    model = quantize_modules(cnn())
    with pytest.raises(UncalibratedQuantizerError, match="0.input_quantizer"):
        export_qat(model, torch.randn(1, 1, 8, 8))
    model, _ = calibrated_cnn()
    model[5].input_quantizer.enable_calib()
    with pytest.raises(ValueError, match="still calibrating: 5.input_quantizer"):
        export_qat(model, torch.randn(1, 1, 8, 8))
    with pytest.raises(ValueError, match="quantize_modules"):
        export_qat(cnn(), torch.randn(1, 1, 8, 8))


def test_the_legacy_exporter_gets_a_clear_error(tmp_path) -> None:
    model, x = calibrated_cnn()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(RuntimeError, match="legacy ONNX exporter"):
            torch.onnx.export(model, (x[:2],), str(tmp_path / "m.onnx"), dynamo=False)
