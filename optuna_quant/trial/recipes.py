"""The simple recipes a practitioner tries first, as configurations of a study's space.

A study queues them right after its reference, before the sensitivity measurement and the
search (:mod:`optuna_quant.study.worker`), so that it holds the best of them within a few trials'
time and the search only improves from there. Each recipe is every layer int8 with a few scopes
set, the others at the reference's choice, cheapest first: the dynamic ones need no
calibration; the static ones reuse the reference's MinMax ranges.

- ``dynamic_per_tensor``: ``quantize_dynamic``'s defaults, onnxruntime's recipe for transformers;
- ``dynamic_per_channel``: the same with per-channel weights;
- ``static_per_tensor``: Q/DQ on the compute operators, per-tensor weights;
- ``static_per_channel``: Q/DQ on the compute operators, per-channel weights;
- ``static_default``: ``quantize_static``'s defaults (Q/DQ on every operator type it takes,
  per-tensor weights).

A recipe whose scopes the space does not search builds the model of another one (or of the
reference) and is left out, so each queued recipe builds a model of its own. On a model without
convolutions the reference is ``dynamic_per_tensor`` itself
(:meth:`optuna_quant.trial.space.SearchSpace.from_model`): the first trial holds its model.

Example:
    >>> space = SearchSpace(nodes=("conv", "fc"), approaches=("static", "dynamic"), dynamic_nodes=("fc",))
    >>> [name for name, _ in recipe_params(space)]
    ['dynamic_per_tensor', 'dynamic_per_channel', 'static_per_tensor', 'static_default']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from optuna_quant.quantization.config import QuantConfig
from optuna_quant.trial.space import SearchSpace


RECIPES: dict[str, dict[str, str]] = {
    "dynamic_per_tensor": {"approach": "dynamic", "granularity": "per_tensor"},
    "dynamic_per_channel": {"approach": "dynamic", "granularity": "per_channel"},
    "static_per_tensor": {"approach": "static", "granularity": "per_tensor", "op_types": "compute"},
    "static_per_channel": {"approach": "static", "granularity": "per_channel", "op_types": "compute"},
    "static_default": {"approach": "static", "granularity": "per_tensor", "op_types": "all"},
}
"""Each recipe's choices, by parameter name, cheapest first."""
RECIPE_SHARE = 4
"""One recipe trial per this many trials of the study's budget, at most."""


def recipe_limit(budget: int | None) -> int | None:
    """How many recipes a study of ``budget`` trials (the reference among them) runs at most.

    Example:
        >>> recipe_limit(40), recipe_limit(9), recipe_limit(4), recipe_limit(None)
        (9, 2, 0, None)
    """
    return None if budget is None else max(0, (budget - 1) // RECIPE_SHARE)


def recipe_params(space: SearchSpace, limit: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The recipes of :data:`RECIPES` that build a model of their own in ``space``, as
    ``(name, params)``, cheapest first, at most ``limit`` of them.

    A recipe is left out where ``space`` cannot build it (a dynamic recipe on a model that the
    dynamic approach does not quantize, a scope switched off at another choice), and where it
    builds the reference's model or an earlier recipe's.

    Args:
        space: The study's search space.
        limit: How many recipes at most; ``None`` for all.

    Returns:
        The recipes' names and parameters (every parameter of ``space``; every layer int8).
    """
    distributions = space.distributions()
    default = space.default_params()
    built = {space.to_config(default)}
    found: list[tuple[str, dict[str, Any]]] = []
    for name, choices in RECIPES.items():
        if limit is not None and len(found) >= limit:
            break
        params = {**default, **{param: choice for param, choice in choices.items() if param in distributions}}
        try:
            config = space.to_config(params)
        except ValueError:  # a choice the space does not offer
            continue
        if _holds(config, choices) and config not in built:
            built.add(config)
            found.append((name, params))
    return found


def _holds(config: QuantConfig, choices: Mapping[str, str]) -> bool:
    """Whether ``config`` is built as ``choices`` say (a scope off keeps the space's base choice)."""
    wanted = {
        "approach": lambda choice: config.approach == choice,
        "granularity": lambda choice: config.per_channel == (choice == "per_channel"),
        "op_types": lambda choice: config.approach == "dynamic" or config.op_types == choice,
    }
    return all(wanted[param](choice) for param, choice in choices.items())
