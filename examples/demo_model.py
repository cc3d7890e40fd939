"""The demo's model: a wide CNN trained on MNIST-5k, made as sensitive to int8 as real MobileNets.

Small CNNs trained briefly lose almost nothing to int8, which leaves a tuner nothing to do. Real
MobileNets are sensitive because some layers have very uneven per-channel ranges. The demo
reproduces that with a function-preserving rescaling of one conv -> ReLU -> conv pair (the inverse
of cross-layer equalisation, Nagel et al. 2019): output channel ``c`` of the first conv is scaled by
``s_c`` and input channel ``c`` of the second by ``1 / s_c``. The fp32 model computes the same
function (ReLU commutes with positive scales); per-tensor int8 activations between the two convs
lose the small channels.

Run it as a script to build and cache the model::

    python -m examples.demo_model
"""

from __future__ import annotations

from pathlib import Path
import time

import numpy as np
import onnx
from onnx import numpy_helper

from examples.mnist import load_mnist
from examples.mnist import MnistSplit

CACHE_DIR = Path(".cache") / "demo"
MODEL_FILE = "mnist_cnn.onnx"
# 5000x between the largest and smallest channel scale: plain int8 then loses about 4 % of the
# accuracy, while keeping the second conv in fp32 (or percentile calibration) recovers it.
SPREAD = (0.002, 10.0)


def train_cnn(data: MnistSplit, epochs: int = 3, seed: int = 0):
    """Train the wide CNN (64/128/128/128 channels) for a few epochs on one or two threads."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    torch.set_num_threads(2)
    model = nn.Sequential(
        nn.Conv2d(1, 64, 3, padding=1), nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(128, 128, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(),
        nn.Flatten(),
        nn.Linear(128 * 7 * 7, 10),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    x, y = torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), 64):
            batch = order[start : start + 64]
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            optimizer.step()
    return model.eval()


def export_onnx(model, path: Path) -> onnx.ModelProto:
    """Export with the TorchScript exporter, which keeps readable node names at opset 17."""
    import torch

    torch.onnx.export(
        model,
        (torch.zeros(1, 1, 28, 28),),
        str(path),
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    return onnx.load(str(path))


def rescale_channels(
    model: onnx.ModelProto, producer: str, consumer: str, spread: tuple[float, float], seed: int = 0
) -> None:
    """Scale ``producer``'s output channels and ``consumer``'s input channels inversely, in place.

    Both nodes are Conv nodes with weights and (for the producer) a bias in the initializers, with
    only ReLU between them, so the model's function is unchanged.
    """
    nodes = {n.name: n for n in model.graph.node}
    inits = {i.name: i for i in model.graph.initializer}
    weight_p, bias_p = nodes[producer].input[1], nodes[producer].input[2]
    weight_c = nodes[consumer].input[1]
    w_p, b_p, w_c = (numpy_helper.to_array(inits[n]) for n in (weight_p, bias_p, weight_c))
    low, high = np.log(spread[0]), np.log(spread[1])
    scales = np.exp(np.random.default_rng(seed).uniform(low, high, w_p.shape[0])).astype(np.float32)
    updated = {
        weight_p: w_p * scales[:, None, None, None],
        bias_p: b_p * scales,
        weight_c: w_c / scales[None, :, None, None],
    }
    for name, array in updated.items():
        inits[name].CopyFrom(numpy_helper.from_array(array.astype(np.float32), name))


def build_demo_model(cache_dir: Path = CACHE_DIR) -> Path:
    """Train, export and rescale the demo model, or return the cached one."""
    path = cache_dir / MODEL_FILE
    if path.is_file():
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    trained = train_cnn(load_mnist())
    raw = cache_dir / "mnist_cnn_trained.onnx"
    model = export_onnx(trained, raw)
    rescale_channels(model, "/4/Conv", "/6/Conv", SPREAD)
    onnx.save(model, str(path))
    raw.unlink()
    print(f"Trained and exported the demo model in {time.perf_counter() - start:.1f} s: {path}")
    return path


if __name__ == "__main__":
    build_demo_model()
