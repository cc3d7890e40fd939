"""The search space read from an ONNX graph: which nodes fall back to fp32, and how to quantize.

Four tuning scopes, named as in OpenVINO POT, each one switchable:

- ``layer``: one categorical per quantizable node, ``"int8"`` or ``"fp32"`` (fallback);
- ``range_estimator``: the activation calibration method;
- ``granularity``: weights per-channel or per-tensor;
- ``mode``: activations and weights symmetric or asymmetric.

Parameters are flat categoricals whose first choice is the default, so that the default
configuration (every node int8, first choice of every other scope) is the reference trial of the
loss. Scopes that are switched off keep the value of the space's ``base`` configuration, which is
how ``fine_tune`` narrows a space around an earlier best result.

Example:
    >>> space = SearchSpace(nodes=("conv1", "fc"), scopes=frozenset({"layer", "granularity"}))
    >>> sorted(space.distributions())
    ['granularity', 'layer:conv1', 'layer:fc']
    >>> space.to_config({"layer:conv1": "fp32", "layer:fc": "int8", "granularity": "per_tensor"})
    QuantConfig(fallback=frozenset({'conv1'}), range_estimator='minmax', per_channel=False, symmetric=True)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import onnx
from optuna.distributions import CategoricalDistribution
from optuna.trial import BaseTrial

SCOPES: tuple[str, ...] = ("layer", "range_estimator", "granularity", "mode")
QUANTIZABLE_OP_TYPES: tuple[str, ...] = ("Conv", "ConvTranspose", "MatMul", "Gemm")
RANGE_ESTIMATORS: tuple[str, ...] = (
    "minmax",
    "entropy",
    "percentile_99.9",
    "percentile_99.99",
    "percentile_99.999",
)
GRANULARITIES: tuple[str, ...] = ("per_channel", "per_tensor")
MODES: tuple[str, ...] = ("symmetric", "asymmetric")
LAYER_CHOICES: tuple[str, ...] = ("int8", "fp32")
LAYER_PREFIX = "layer:"


@dataclass(frozen=True)
class QuantConfig:
    """One quantization configuration.

    Attributes:
        fallback: Names of the quantizable nodes kept in fp32.
        range_estimator: One of :data:`RANGE_ESTIMATORS`.
        per_channel: Per-channel weight scales (else one scale per tensor).
        symmetric: Symmetric activation and weight ranges (else asymmetric).
    """

    fallback: frozenset[str] = frozenset()
    range_estimator: str = RANGE_ESTIMATORS[0]
    per_channel: bool = GRANULARITIES[0] == "per_channel"
    symmetric: bool = MODES[0] == "symmetric"

    def __post_init__(self) -> None:
        if self.range_estimator not in RANGE_ESTIMATORS:
            raise ValueError(
                f"Unknown range_estimator {self.range_estimator!r}; choose from {RANGE_ESTIMATORS}."
            )


def quantizable_nodes(model: onnx.ModelProto) -> tuple[str, ...]:
    """Names of the graph's Conv, ConvTranspose, MatMul and Gemm nodes, in graph order."""
    return tuple(n.name for n in model.graph.node if n.op_type in QUANTIZABLE_OP_TYPES)


@dataclass(frozen=True)
class SearchSpace:
    """The tunable part of :class:`QuantConfig` for one model.

    Args:
        nodes: Quantizable nodes that the ``layer`` scope may keep in fp32.
        scopes: The tuning scopes that vary; the others keep ``base``'s values.
        base: The configuration that switched-off scopes take their values from.
    """

    nodes: tuple[str, ...]
    scopes: frozenset[str] = frozenset(SCOPES)
    base: QuantConfig = field(default_factory=QuantConfig)

    def __post_init__(self) -> None:
        unknown = set(self.scopes) - set(SCOPES)
        if unknown:
            raise ValueError(f"Unknown tuning scope(s) {sorted(unknown)}; choose from {SCOPES}.")
        if not self.scopes:
            raise ValueError("At least one tuning scope must be switched on.")
        if "layer" in self.scopes and not self.nodes:
            raise ValueError("The 'layer' scope is on but no node is tunable.")

    @classmethod
    def from_model(
        cls,
        model: onnx.ModelProto,
        scopes: Iterable[str] = SCOPES,
        nodes: Iterable[str] | None = None,
    ) -> SearchSpace:
        """The space of ``model``: every quantizable node, or only ``nodes``.

        Raises:
            ValueError: If the model has no quantizable node, or ``nodes`` names a node that is
                not a quantizable node of the model.
        """
        available = quantizable_nodes(model)
        if not available:
            raise ValueError(
                f"The model has no quantizable node (op types {', '.join(QUANTIZABLE_OP_TYPES)})."
            )
        if nodes is None:
            chosen = available
        else:
            chosen = tuple(nodes)
            missing = [name for name in chosen if name not in available]
            if missing:
                raise ValueError(
                    f"Node(s) {missing} are not quantizable nodes of the model; "
                    f"quantizable nodes are {list(available)}."
                )
        return cls(nodes=chosen, scopes=frozenset(scopes))

    def distributions(self) -> dict[str, CategoricalDistribution]:
        """The Optuna distributions of the space, by parameter name."""
        dists: dict[str, CategoricalDistribution] = {}
        if "layer" in self.scopes:
            for node in self.nodes:
                dists[LAYER_PREFIX + node] = CategoricalDistribution(LAYER_CHOICES)
        if "range_estimator" in self.scopes:
            dists["range_estimator"] = CategoricalDistribution(RANGE_ESTIMATORS)
        if "granularity" in self.scopes:
            dists["granularity"] = CategoricalDistribution(GRANULARITIES)
        if "mode" in self.scopes:
            dists["mode"] = CategoricalDistribution(MODES)
        return dists

    def suggest(self, trial: BaseTrial) -> dict[str, Any]:
        """Ask ``trial`` for every parameter of the space, in a fixed order."""
        return {
            name: trial.suggest_categorical(name, dist.choices)
            for name, dist in self.distributions().items()
        }

    def default_params(self) -> dict[str, Any]:
        """The reference configuration's parameters: the first choice of each."""
        return {name: dist.choices[0] for name, dist in self.distributions().items()}

    def to_config(self, params: Mapping[str, Any]) -> QuantConfig:
        """The configuration that ``params`` describe within this space.

        Raises:
            ValueError: If a parameter is missing or has a value outside its choices.
        """
        for name, dist in self.distributions().items():
            if name not in params:
                raise ValueError(f"Parameter {name!r} is missing from {dict(params)!r}.")
            if params[name] not in dist.choices:
                raise ValueError(f"Parameter {name!r} has value {params[name]!r}, not one of {dist.choices}.")
        config = self.base
        if "layer" in self.scopes:
            fallback = {n for n in self.nodes if params[LAYER_PREFIX + n] == "fp32"}
            config = replace(config, fallback=frozenset(fallback | (config.fallback - set(self.nodes))))
        if "range_estimator" in self.scopes:
            config = replace(config, range_estimator=params["range_estimator"])
        if "granularity" in self.scopes:
            config = replace(config, per_channel=params["granularity"] == "per_channel")
        if "mode" in self.scopes:
            config = replace(config, symmetric=params["mode"] == "symmetric")
        return config

    def narrow(self, best: QuantConfig, scopes: Iterable[str]) -> SearchSpace:
        """A space around ``best`` in which only ``scopes`` vary (POT's ``fine_tune``)."""
        return replace(self, scopes=frozenset(scopes), base=best)

    def to_dict(self) -> dict[str, Any]:
        """The space as JSON-serialisable data, stored with the study."""
        return {
            "nodes": list(self.nodes),
            "scopes": sorted(self.scopes),
            "base": {
                "fallback": sorted(self.base.fallback),
                "range_estimator": self.base.range_estimator,
                "per_channel": self.base.per_channel,
                "symmetric": self.base.symmetric,
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchSpace:
        """The space stored by :meth:`to_dict`."""
        base = dict(data["base"])
        base["fallback"] = frozenset(base["fallback"])
        return cls(nodes=tuple(data["nodes"]), scopes=frozenset(data["scopes"]), base=QuantConfig(**base))
