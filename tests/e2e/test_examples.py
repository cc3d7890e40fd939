"""The examples' shared model pieces: the inverse cross-layer equalisation and the tiny CNN."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest


torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from examples.channel_rescaling import rescale_pair  # noqa: E402
from examples.tiny_cnn import build_cnn  # noqa: E402
from examples.tiny_cnn import calibration_data  # noqa: E402
from examples.tiny_cnn import fp32_agreement  # noqa: E402


def test_rescale_pair_keeps_the_function_and_spreads_the_ranges() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 1), nn.Flatten(), nn.Linear(8, 2), nn.ReLU(), nn.Linear(2, 3)
    )
    x = torch.rand(5, 3, 4, 4)
    before = model(x).detach()
    weight = model[0].weight.detach().clone()
    rescale_pair(model[0], model[2], torch.tensor([0.01, 1.0, 10.0, 100.0]))
    rescale_pair(model[4], model[6], torch.tensor([0.5, 40.0]))
    torch.testing.assert_close(model(x), before, rtol=1e-5, atol=1e-6)
    assert torch.equal(model[0].weight[1], weight[1])  # scale 1
    assert torch.equal(model[0].weight[3], weight[3] * 100.0)


def test_rescale_pair_rejects_what_would_change_the_function() -> None:
    producer, consumer = nn.Conv2d(2, 2, 1), nn.Conv2d(2, 2, 1)
    with pytest.raises(ValueError, match="positive"):
        rescale_pair(producer, consumer, torch.tensor([1.0, -1.0]))
    grouped = nn.Conv2d(2, 2, 3, groups=2)
    weight = producer.weight.detach().clone()
    with pytest.raises(ValueError, match="grouped"):
        rescale_pair(producer, grouped, torch.tensor([2.0, 3.0]))
    assert torch.equal(producer.weight, weight)  # refused before anything changed


def test_tiny_cnn_and_its_data() -> None:
    model = build_cnn(channels=(8, 16, 16), image_size=10)
    assert [n.name for n in model.graph.node if n.op_type in ("Conv", "Gemm")] == ["conv1", "conv2", "conv3", "fc"]
    assert [a.shape for a in calibration_data(model, n=3)] == [(1, 3, 10, 10)] * 3
    agreement = fp32_agreement(model, n=50)
    assert agreement.inputs.shape == (50, 3, 10, 10)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert agreement(session) == 1.0
    assert not np.array_equal(build_cnn(seed=1).graph.initializer[0].raw_data, build_cnn().graph.initializer[0].raw_data)
