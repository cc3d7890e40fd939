"""Three small models of different architectures for the sampler tables, and how they are made sensitive.

Small models trained briefly on MNIST lose almost nothing in int8 (DESIGN.md section 7), so a table
of them would not tell samplers apart. Real models are sensitive because some channels of a tensor
span far wider ranges than the rest; the scales here reproduce MobileNet's uneven per-channel
ranges and the outlier features of large CNNs and transformers, applied by the function-preserving
inverse cross-layer equalisation of :func:`examples.channel_rescaling.rescale_pair`.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn


def conv_bn(c_in: int, c_out: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
    """Conv, BatchNorm, ReLU: the unit of both CNNs."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel, stride, padding=kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(),
    )


def dw_separable(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    """MobileNet's block: a depthwise 3x3 conv, then a pointwise 1x1 conv."""
    return nn.Sequential(conv_bn(c_in, c_in, 3, stride, groups=c_in), conv_bn(c_in, c_out, 1))


class PooledCNN(nn.Module):
    """Features, global average pooling, a linear head."""

    def __init__(self, features: nn.Sequential, width: int) -> None:
        super().__init__()
        self.features = features
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.features(x)))


class DepthwiseSeparableNet(PooledCNN):
    """A MobileNet-style CNN: a stem conv, three depthwise-separable blocks, a linear head."""

    def __init__(self) -> None:
        features = nn.Sequential(
            conv_bn(1, 64, 3, stride=2),
            dw_separable(64, 128, 1),
            dw_separable(128, 256, 2),
            dw_separable(256, 256, 1),
        )
        super().__init__(features, 256)


class WideCNN(PooledCNN):
    """A plain CNN with 64/128/128/128 channels, wide enough that int8 pays (DESIGN.md section 7)."""

    def __init__(self) -> None:
        features = nn.Sequential(
            conv_bn(1, 64), conv_bn(64, 128, stride=2), conv_bn(128, 128, stride=2), conv_bn(128, 128)
        )
        super().__init__(features, 128)


class MLP(nn.Module):
    """A multi-layer perceptron of Gemm nodes on the flattened image."""

    def __init__(self, widths: tuple[int, ...] = (784, 1024, 1024, 512, 512, 10)) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        for i, (w_in, w_out) in enumerate(zip(widths, widths[1:])):
            layers.append(nn.Linear(w_in, w_out))
            if i < len(widths) - 2:
                layers.append(nn.ReLU())
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _conv_bn_units(model: nn.Module) -> Iterator[nn.Sequential]:
    for module in model.modules():
        if isinstance(module, nn.Sequential) and len(module) == 3 and isinstance(module[1], nn.BatchNorm2d):
            yield module


@torch.no_grad()
def fold_batchnorm(model: nn.Module) -> None:
    """Fold every conv_bn unit's BatchNorm into its conv, so that rescaling sees the real weights."""
    for unit in _conv_bn_units(model):
        conv, bn = unit[0], unit[1]
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        conv.weight.mul_(scale.reshape(-1, 1, 1, 1))
        conv.bias = nn.Parameter(bn.bias - bn.running_mean * scale)
        unit[1] = nn.Identity()


def log_uniform_scales(n: int, spread: float, generator: torch.Generator) -> torch.Tensor:
    """``n`` scales log-uniform in ``[1 / spread, spread]``: uneven ranges, as in MobileNet's depthwise layers."""
    return torch.exp((2 * torch.rand(n, generator=generator) - 1) * torch.log(torch.tensor(spread)))


def outlier_scales(n: int, n_outliers: int, factor: float, generator: torch.Generator) -> torch.Tensor:
    """Scales of 1 except ``n_outliers`` channels scaled by ``factor``: outlier features."""
    scales = torch.ones(n)
    scales[torch.randperm(n, generator=generator)[:n_outliers]] = factor
    return scales
