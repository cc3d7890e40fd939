"""Parameter selection for QAT fine-tuning, after pytorch_quantization's ``optim.helper``.

The four functions keep the original's semantics: patterns are regular expressions matched with
``re.search`` against ``named_parameters()`` names; a parameter matching two patterns of one
list is yielded twice (the patterns are meant to be exclusive, and nothing checks it);
``group_parameters`` returns groups whose ``'params'`` are one-shot generators, ready for a
``torch.optim`` constructor. Unlike the original, a pattern list given as a bare string or
holding a non-string raises ``TypeError`` instead of being matched character by character.

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> groups = group_parameters(model, [[r"^0\\."], [r"^2\\."]], lrs=[1e-4, 1e-3])
    >>> optimizer = torch.optim.SGD(groups, lr=1e-2)
    >>> [group["lr"] for group in optimizer.param_groups]
    [0.0001, 0.001]
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Sequence
import logging
import re
from typing import Any
import warnings

import torch
from torch import nn

from optuna_quant.qat.tensor_quantizer import TensorQuantizer


__all__ = ["freeze_parameters", "group_parameters", "match_parameters", "quant_weight_inplace"]

_logger = logging.getLogger(__name__)


def match_parameters(model: nn.Module, patterns: Iterable[str]) -> Iterator[nn.Parameter]:
    """Yield the parameters whose name matches a pattern, once per matching pattern.

    The patterns are checked when called; the result is a generator, so it can be consumed once.

    Args:
        model: A module.
        patterns: Regular expressions searched (``re.search``) in parameter names.

    Returns:
        A generator over the matching parameters, in ``named_parameters()`` order.

    Raises:
        TypeError: ``patterns`` is a string or holds a non-string.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(2, 2))
        >>> len(list(match_parameters(model, ["weight", "0"])))  # weight twice, bias once
        3
    """
    return _match(model, _check_patterns(patterns))


def _match(model: nn.Module, patterns: tuple[str, ...]) -> Iterator[nn.Parameter]:
    for name, param in model.named_parameters():
        for pattern in patterns:
            if re.search(pattern, name):
                yield param


def group_parameters(
    model: nn.Module,
    patterns_list: list[list[str]],
    lrs: Sequence[float] | None = None,
    momentums: Sequence[float] | None = None,
    weight_decays: Sequence[float] | None = None,
) -> list[dict[str, Any]]:
    """Build optimizer parameter groups, one per pattern list.

    Each group is ``{'params': match_parameters(model, patterns)}``, plus ``'lr'``,
    ``'momentum'`` and ``'weight_decay'`` where those lists are given (the keys are absent
    otherwise, so the optimizer's defaults apply). Parameters matched by no list are left out
    of the optimizer, which is a way to freeze them.

    Args:
        model: A module.
        patterns_list: A list of lists of patterns. The lists should select disjoint parameters:
            ``torch.optim`` rejects a parameter that appears in two groups.
        lrs: One learning rate per pattern list, or None.
        momentums: One momentum per pattern list, or None.
        weight_decays: One weight decay per pattern list, or None.

    Returns:
        A list of parameter-group dicts.

    Raises:
        TypeError: ``patterns_list`` is not a list of lists of strings, or ``lrs``,
            ``momentums`` or ``weight_decays`` has a different length than ``patterns_list``.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        >>> groups = group_parameters(model, [["^0"], ["^1"]], lrs=[0.1, 0.01])
        >>> [sorted(group) for group in groups]
        [['lr', 'params'], ['lr', 'params']]
    """
    if not isinstance(patterns_list, list) or not all(isinstance(p, list) for p in patterns_list):
        raise TypeError("patterns_list must be a list of lists of patterns")
    groups: list[dict[str, Any]] = [
        {"params": match_parameters(model, patterns)} for patterns in patterns_list
    ]
    for key, values in (("lr", lrs), ("momentum", momentums), ("weight_decay", weight_decays)):
        if values is None:
            continue
        if len(values) != len(patterns_list):
            raise TypeError(
                f"len({key}s) must match len(patterns_list): {len(values)} != {len(patterns_list)}"
            )
        for group, value in zip(groups, values):
            group[key] = value
    return groups


def freeze_parameters(model: nn.Module, patterns: Iterable[str]) -> None:
    """Set ``requires_grad = False`` on the parameters whose name matches a pattern.

    Args:
        model: A module.
        patterns: Regular expressions searched (``re.search``) in parameter names.

    Raises:
        TypeError: ``patterns`` is a string or holds a non-string.

    Example:
        >>> from torch import nn
        >>> model = nn.Linear(2, 2)
        >>> freeze_parameters(model, ["bias"])
        >>> model.weight.requires_grad, model.bias.requires_grad
        (True, False)
    """
    checked = _check_patterns(patterns)
    for name, param in model.named_parameters():
        if any(re.search(pattern, name) for pattern in checked):
            _logger.info("Freeze %s.", name)
            param.requires_grad = False


def quant_weight_inplace(model: nn.Module) -> None:
    """Overwrite each quantized module's weight with its fake-quantized value.

    A quantized module is one with a ``weight`` and a :class:`TensorQuantizer` named
    ``weight_quantizer`` (``QuantLinear``, ``QuantConv2d``). The quantizer stays on: it now
    maps the weight to itself, so a second call changes nothing, and further training starts
    from weights on the int8 grid (the relax-and-round step of pytorch_quantization).

    Args:
        model: A calibrated model.

    Raises:
        UncalibratedQuantizerError: An enabled weight quantizer has no ``amax``.

    Warns:
        UserWarning: The model has no quantized module, or a weight quantizer has
            ``fake_quant=False`` (the weight then holds integer codes, for inference only).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from optuna_quant.qat import calibrate, quantize_modules
        >>> model = quantize_modules(nn.Sequential(nn.Linear(4, 2)))
        >>> calibrate(model, [torch.randn(8, 4)])
        >>> quant_weight_inplace(model)
        >>> torch.equal(model[0].weight, model[0].weight_quantizer(model[0].weight))
        True
    """
    found = False
    for name, module in model.named_modules():
        quantizer = getattr(module, "weight_quantizer", None)
        if not isinstance(quantizer, TensorQuantizer):
            continue
        found = True
        if not quantizer.fake_quant:
            warnings.warn(
                f"{name}: in-place real quantization writes integer codes into the weight; use "
                "the model for inference only",
                stacklevel=2,
            )
        _logger.info("In-place quantize weight of %s", name)
        with torch.no_grad():
            module.weight.copy_(quantizer(module.weight))
    if not found:
        warnings.warn(
            "quant_weight_inplace found no quantized module (one with a TensorQuantizer named "
            "weight_quantizer): call quantize_modules(model) first",
            stacklevel=2,
        )


def _check_patterns(patterns: Iterable[str]) -> tuple[str, ...]:
    if isinstance(patterns, (str, bytes)):
        raise TypeError(f"patterns must be a list of strings, not a single string: {patterns!r}")
    checked = tuple(patterns)
    for pattern in checked:
        if not isinstance(pattern, str):
            raise TypeError(f"patterns must be strings, got {type(pattern).__name__}: {pattern!r}")
    return checked
