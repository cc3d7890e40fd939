"""Make a model sensitive to int8 without changing its fp32 function: inverse cross-layer equalisation.

Small models trained briefly lose almost nothing to int8, which leaves a tuner nothing to do. Real
models are sensitive because some channels of a tensor span far wider ranges than the rest:
MobileNet's depthwise outputs (uneven per-channel ranges) and the outlier features of large CNNs
and transformers (a handful of channels a hundred times larger). Both are reproduced exactly in
fp32 by a per-channel rescaling of a producer -> consumer pair across a ReLU,
``ReLU(s * x) = s * ReLU(x)`` for ``s > 0``: the producer's output channel ``c`` is multiplied by
``s_c`` and the consumer's input channel ``c`` divided by it. This is the inverse of cross-layer
equalisation (Nagel et al. 2019); per-tensor int8 activations between the two layers then lose the
small channels. The demo, the QAT recipe and the benchmark models all use :func:`rescale_pair`.
"""

from __future__ import annotations

import torch
from torch import nn


Layer = nn.Conv2d | nn.Linear


@torch.no_grad()
def rescale_pair(producer: Layer, consumer: Layer, scales: torch.Tensor) -> None:
    """Multiply ``producer``'s output channels by ``scales`` and divide ``consumer``'s inputs by them.

    Function-preserving when only a ReLU (or nothing) lies between them and every scale is positive.

    Args:
        producer: The layer whose output channels are scaled; it needs a bias.
        consumer: The layer that reads the producer's channels, not a grouped convolution.
        scales: One positive float32 scale per output channel of ``producer``.

    Raises:
        ValueError: If a scale is not positive or ``consumer`` is a grouped convolution.
    """
    if not bool((scales > 0).all()):
        raise ValueError("Scales must be positive to commute with ReLU.")
    if isinstance(consumer, nn.Conv2d) and consumer.groups > 1:
        raise ValueError("A grouped consumer mixes no channels: rescale its producer instead.")
    producer.weight.mul_(scales.reshape((-1,) + (1,) * (producer.weight.dim() - 1)))
    producer.bias.mul_(scales)
    consumer.weight.div_(scales.reshape(1, -1, *(1,) * (consumer.weight.dim() - 2)))
