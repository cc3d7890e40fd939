"""The demo's model: a wide CNN trained on MNIST-5k, made as sensitive to int8 as real MobileNets.

Small CNNs trained briefly lose almost nothing to int8, which leaves a tuner nothing to do. Real
MobileNets are sensitive because some layers have very uneven per-channel ranges. The demo
reproduces that with a function-preserving rescaling of one conv -> ReLU -> conv pair (the inverse
of cross-layer equalisation, see :mod:`examples.channel_rescaling`): output channel ``c`` of the
first conv is scaled by ``s_c`` and input channel ``c`` of the second by ``1 / s_c``. The fp32
model computes the same function; per-tensor int8 activations between the two convs lose the small
channels.

Run it as a script to build and cache the model::

    python -m examples.demo_model
"""

from __future__ import annotations

from pathlib import Path
import time
from typing import TYPE_CHECKING

import numpy as np

from examples.mnist import load_mnist
from examples.mnist import MnistSplit


if TYPE_CHECKING:
    from torch import nn

CACHE_DIR = Path(".cache") / "demo"
MODEL_FILE = "mnist_cnn.onnx"
# 5000x between the largest and smallest channel scale: plain int8 then loses about 4 % of the
# accuracy, while keeping the second conv in fp32 (or percentile calibration) recovers it.
SPREAD = (0.002, 10.0)


def train_cnn(data: MnistSplit, epochs: int = 3, seed: int = 0) -> nn.Sequential:
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


def sensitise(model: nn.Sequential, seed: int = 0) -> None:
    """Rescale the conv 4 -> ReLU -> conv 6 pair of :func:`train_cnn`'s CNN, in place.

    The scales are log-uniform over ``SPREAD``, drawn with numpy's generator seeded with ``seed``.
    """
    import torch

    from examples.channel_rescaling import rescale_pair

    producer, consumer = model[4], model[6]
    low, high = np.log(SPREAD[0]), np.log(SPREAD[1])
    draws = np.random.default_rng(seed).uniform(low, high, producer.out_channels)
    rescale_pair(producer, consumer, torch.from_numpy(np.exp(draws).astype(np.float32)))


def export_onnx(model: nn.Module, path: Path) -> None:
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


def build_demo_model(cache_dir: Path = CACHE_DIR) -> Path:
    """Train, rescale and export the demo model, or return the cached one."""
    path = cache_dir / MODEL_FILE
    if path.is_file():
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    model = train_cnn(load_mnist())
    sensitise(model)
    export_onnx(model, path)
    print(f"Trained and exported the demo model in {time.perf_counter() - start:.1f} s: {path}")
    return path


if __name__ == "__main__":
    build_demo_model()
