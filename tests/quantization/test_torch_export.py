from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest


torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
from torch import nn  # noqa: E402

from optuna_quant.quantization.config import QUANTIZABLE_OP_TYPES  # noqa: E402
from optuna_quant.quantization.torch_export import export_module  # noqa: E402


torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class Net(nn.Module):
    """Nested containers, Conv+BatchNorm (fused by the exporter), a Linear on a 3-D input
    (exported as MatMul with a transposed weight), a reused Linear and a root-level matmul."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3)
        self.layers = nn.ModuleList([nn.Sequential(Block(), Block()) for _ in range(2)])
        self.tokens = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)
        self.register_buffer("mix", torch.ones(3, 3) / 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        x = self.tokens(x.flatten(2).transpose(1, 2))[:, 0]
        return self.head(x) @ self.mix + self.head(2 * x)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    torch.manual_seed(0)
    net = Net()
    for module in net.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    net.train()
    path = tmp_path_factory.mktemp("export") / "net.onnx"
    onnx_model, node_modules = export_module(net, torch.randn(2, 1, 8, 8), path, opset=17)
    return net, onnx_model, node_modules, path


def test_maps_quantizable_nodes_to_their_modules(exported: tuple) -> None:
    net, onnx_model, node_modules, _ = exported
    nodes = {node.name: node.op_type for node in onnx_model.graph.node}
    quantizable = {name for name, op_type in nodes.items() if op_type in QUANTIZABLE_OP_TYPES}
    assert set(node_modules) == quantizable
    assert Counter((nodes[name], owner) for name, owner in node_modules.items()) == Counter(
        {
            ("Conv", "stem"): 1,
            ("Conv", "layers.0.0.conv"): 1,
            ("Conv", "layers.0.1.conv"): 1,
            ("Conv", "layers.1.0.conv"): 1,
            ("Conv", "layers.1.1.conv"): 1,
            ("MatMul", "tokens"): 1,
            ("Gemm", "head"): 2,
            ("MatMul", ""): 1,
        }
    )
    assert set(node_modules.values()) <= {name for name, _ in net.named_modules()}
    # The BatchNorms were folded into the convolutions.
    assert "BatchNormalization" not in nodes.values()


def test_exports_a_runnable_model_at_a_lower_opset(exported: tuple) -> None:
    net, onnx_model, _, path = exported
    assert onnx_model.opset_import[0].version == 17
    onnx.checker.check_model(onnx_model)
    assert onnx.load(str(path)).graph.node[0].name == onnx_model.graph.node[0].name
    assert net.training  # mode restored after the export in eval mode

    x = torch.randn(5, 1, 8, 8)  # not the example's batch size
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        expected = net.eval()(x).numpy()
    net.train()
    assert np.allclose(out, expected, atol=1e-5)


def test_rejects_a_non_module() -> None:
    with pytest.raises(TypeError, match="torch.nn.Module"):
        export_module(lambda x: x, torch.randn(1))  # type: ignore[arg-type]


@pytest.mark.parametrize("inputs", [np.zeros((1, 4), dtype=np.float32), (), [torch.randn(1, 4), 3]])
def test_rejects_example_inputs_that_are_not_tensors(inputs: object) -> None:
    with pytest.raises(TypeError, match="example_inputs"):
        export_module(nn.Linear(4, 2), inputs)  # type: ignore[arg-type]


def test_reports_example_inputs_the_module_fails_on() -> None:
    with pytest.raises(ValueError, match=r"fails on example_inputs of shapes \(1, 5\)"):
        export_module(nn.Linear(4, 2), torch.randn(1, 5))


def test_refuses_an_invalid_down_conversion() -> None:
    # onnx 1.23 converts ReduceMean-18 to a ReduceMean-17 that keeps an opset-18 attribute.
    class GlobalPool(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean((2, 3))

    with pytest.raises(ValueError, match="pass opset=18"):
        export_module(GlobalPool(), torch.randn(1, 2, 4, 4), opset=17)


def test_rejects_opsets_without_per_channel_qdq() -> None:
    with pytest.raises(ValueError, match="at least 13"):
        export_module(nn.Linear(4, 2), torch.randn(1, 4), opset=12)
