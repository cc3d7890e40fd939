"""The Optuna search space of a model: which nodes fall back to fp32, and how to quantize.

The tuning scopes, named as in OpenVINO POT where POT has the scope, each one switchable:

- ``layer``: one categorical per quantizable node, ``"int8"`` or ``"fp32"`` (fallback); or, on a
  transformer, one per group of layers (``layer_groups="block"`` or ``"role"``,
  :mod:`optuna_quant.quantization.groups`), which keeps the whole group in fp32 or int8;
- ``range_estimator``: the activation calibration method;
- ``granularity``: weights per-channel or per-tensor;
- ``mode``: two parameters, ``activation_mode`` and ``weight_mode``, each symmetric or
  asymmetric. Asymmetric activations are uint8; symmetric ones are int8 (symmetric uint8 would
  force zero point 128 and waste half the range after a ReLU). Weights are int8 either way, with
  zero point 0 when symmetric (uint8 weights ran at half the speed on the demo model);
- ``op_types``: which operator types get Q/DQ (:func:`optuna_quant.quantization.config.op_type_sets`): only the compute-heavy
  ones, onnxruntime's QDQ registry, or everything ``quantize_static`` quantizes by default;
- ``approach``: static Q/DQ or dynamic (activations quantized at run time), on a model where
  dynamic quantizes something (:func:`optuna_quant.quantization.config.approach_choices`);
- ``weight_type``: int8, 7-bit (onnxruntime's ``reduce_range``) or uint8 weights, on a CPU whose
  int8 kernels can saturate (x86 without VNNI,
  :func:`optuna_quant.quantization.config.weight_type_choices`);
- ``equalization``: cross-layer equalization of the fp32 weights before quantization, ``"off"``
  or ``"on"``, on a model where it applies; one scope and parameter per recovery transform of
  :data:`optuna_quant.quantization.recovery.TRANSFORMS`
  (:func:`optuna_quant.quantization.recovery.applicable_transforms`).

Parameters are flat categoricals whose first choice is the reference, onnxruntime's recommended
recipe (asymmetric uint8 activations, symmetric int8 weights, per channel, Q/DQ around the
compute-heavy operators only; on a model without convolutions ``quantize_dynamic``'s defaults,
dynamic per tensor, the first recipe tried on a transformer), so that the
default configuration (every node int8, first choice of every other scope) is the reference
trial of the loss. A scope with a single choice on the model has no parameter. Scopes that are
switched off keep the value of the space's ``base`` configuration, which is how ``fine_tune``
narrows a space around an earlier best result. Parameters that the approach ignores (the range
estimator under dynamic, say) give equal configurations (:meth:`SearchSpace.to_config`), which
the duplicate check and the claim of a running trial compare; the samplers of this package are
told which (:meth:`SearchSpace.inactive`), and do not propose the second.

Example:
    >>> space = SearchSpace(nodes=("conv1", "fc"), scopes=frozenset({"layer", "granularity"}))
    >>> sorted(space.distributions())
    ['granularity', 'layer:conv1', 'layer:fc']
    >>> config = space.to_config({"layer:conv1": "fp32", "layer:fc": "int8", "granularity": "per_tensor"})
    >>> config.fallback, config.per_channel, config.activation_symmetric, config.weight_symmetric
    (frozenset({'conv1'}), False, False, True)
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
import logging
from typing import Any

import onnx
import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import BaseTrial

from optuna_quant._optuna_private import set_trial_params
from optuna_quant.quantization.config import ACTIVATION_MODES
from optuna_quant.quantization.config import approach_choices
from optuna_quant.quantization.config import APPROACHES
from optuna_quant.quantization.config import dynamic_nodes
from optuna_quant.quantization.config import effective_config
from optuna_quant.quantization.config import GRANULARITIES
from optuna_quant.quantization.config import op_type_choices
from optuna_quant.quantization.config import OP_TYPE_SET_NAMES
from optuna_quant.quantization.config import QuantConfig
from optuna_quant.quantization.config import quantizable_nodes
from optuna_quant.quantization.config import QUANTIZABLE_OP_TYPES
from optuna_quant.quantization.config import RANGE_ESTIMATORS
from optuna_quant.quantization.config import subgraph_quantizable_nodes
from optuna_quant.quantization.config import WEIGHT_MODES
from optuna_quant.quantization.config import weight_type_choices
from optuna_quant.quantization.config import WEIGHT_TYPES
from optuna_quant.quantization.groups import layer_groups as read_layer_groups
from optuna_quant.quantization.recovery import applicable_transforms
from optuna_quant.quantization.recovery import RECOVERY_CHOICES
from optuna_quant.quantization.recovery import TRANSFORMS


SCOPES: tuple[str, ...] = (
    "layer", "range_estimator", "granularity", "mode", "op_types", "approach", "weight_type", *TRANSFORMS
)
LAYER_CHOICES: tuple[str, ...] = ("int8", "fp32")
LAYER_PREFIX = "layer:"

_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchSpace:
    """The tunable part of :class:`QuantConfig` for one model.

    Args:
        nodes: Quantizable nodes that the ``layer`` scope may keep in fp32.
        scopes: The tuning scopes that vary; the others keep ``base``'s values.
        base: The configuration that switched-off scopes take their values from.
        op_types: The choices of the ``op_types`` scope (among :data:`~optuna_quant.quantization.config.OP_TYPE_SET_NAMES`).
        approaches: The choices of the ``approach`` scope, the reference first (among
            :data:`~optuna_quant.quantization.config.APPROACHES`).
        dynamic_nodes: The quantizable nodes that the dynamic approach quantizes.
        weight_types: The choices of the ``weight_type`` scope, the reference first (among
            :data:`~optuna_quant.quantization.config.WEIGHT_TYPES`).
        granularities: The choices of the ``granularity`` scope, the reference first (both of
            :data:`~optuna_quant.quantization.config.GRANULARITIES`).
        groups: The ``layer`` scope's groups, ``(name, nodes)`` each, which split ``nodes``
            between them; none: one parameter per node.
        transforms: The recovery transforms that apply to the model, each a scope (among
            :data:`~optuna_quant.quantization.recovery.TRANSFORMS`).
    """

    nodes: tuple[str, ...]
    scopes: frozenset[str] = frozenset(SCOPES)
    base: QuantConfig = field(default_factory=QuantConfig)
    op_types: tuple[str, ...] = OP_TYPE_SET_NAMES
    approaches: tuple[str, ...] = APPROACHES[:1]
    dynamic_nodes: tuple[str, ...] = ()
    weight_types: tuple[str, ...] = WEIGHT_TYPES[:1]
    granularities: tuple[str, ...] = GRANULARITIES
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    transforms: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.scopes) - set(SCOPES)
        if unknown:
            raise ValueError(f"Unknown tuning scope(s) {sorted(unknown)}; choose from {SCOPES}.")
        if not self.scopes:
            raise ValueError("At least one tuning scope must be switched on.")
        if "layer" in self.scopes and not self.nodes:
            raise ValueError("The 'layer' scope is on but no node is tunable.")
        foreign = [name for name in self.op_types if name not in OP_TYPE_SET_NAMES]
        if foreign or not self.op_types:
            raise ValueError(f"op_types choices {list(self.op_types)} must be among {OP_TYPE_SET_NAMES}.")
        if not self.approaches or not set(self.approaches) <= set(APPROACHES):
            raise ValueError(f"approach choices {list(self.approaches)} must be among {APPROACHES}.")
        if not self.weight_types or not set(self.weight_types) <= set(WEIGHT_TYPES):
            raise ValueError(f"weight_type choices {list(self.weight_types)} must be among {WEIGHT_TYPES}.")
        if sorted(self.granularities) != sorted(GRANULARITIES):
            raise ValueError(f"granularity choices {list(self.granularities)} must be {list(GRANULARITIES)} in some order.")
        if not set(self.transforms) <= set(TRANSFORMS):
            raise ValueError(f"transforms {list(self.transforms)} must be among {list(TRANSFORMS)}.")
        grouped = [node for _, nodes in self.groups for node in nodes]
        if self.groups and (sorted(grouped) != sorted(self.nodes) or len(dict(self.groups)) != len(self.groups)):
            raise ValueError("The layer groups must have distinct names and hold every node of the space once.")

    def units(self) -> dict[str, tuple[str, ...]]:
        """What each parameter of the ``layer`` scope switches, by name: a group's nodes, or one node.

        Example:
            >>> SearchSpace(nodes=("q0", "q1", "fc"), groups=(("query", ("q0", "q1")), ("fc", ("fc",)))).units()
            {'query': ('q0', 'q1'), 'fc': ('fc',)}
        """
        return dict(self.groups) if self.groups else {node: (node,) for node in self.nodes}

    @classmethod
    def from_model(
        cls,
        model: onnx.ModelProto,
        scopes: Iterable[str] = SCOPES,
        nodes: Iterable[str] | None = None,
        layer_groups: str | None = None,
        module_of_node: Mapping[str, str] | None = None,
        int8_class: str | None = None,
    ) -> SearchSpace:
        """The space of ``model``: every quantizable node, or only ``nodes``.

        Build it from the model that is quantized (the prepared one, see
        :func:`optuna_quant.quantization.prepare.prepare_model`): preparation renames and removes nodes.

        Args:
            model: The model that is quantized.
            scopes: The scopes that vary.
            nodes: The nodes of the ``layer`` scope; default every quantizable node.
            layer_groups: ``"block"`` or ``"role"`` for one ``layer`` parameter per group of
                :func:`optuna_quant.quantization.groups.layer_groups` (of ``nodes``); ``None``
                for one per node.
            module_of_node: The module name of each node, for a ``torch.nn.Module`` export:
                the groups are read from it where it names the block and the role.
            int8_class: The int8 class of the CPU that runs the trials
                (:mod:`optuna_quant.measure.cpu`), which decides the ``weight_type`` choices.

        Raises:
            ValueError: If the model has no quantizable node in its top-level graph (the message
                names those inside ``If``/``Loop``/``Scan`` bodies), ``nodes`` names a node that
                is not a quantizable node of the model, or ``layer_groups`` is unknown.
        """
        scopes = frozenset(scopes)  # read twice below: an iterator would be spent
        available = quantizable_nodes(model)
        if not available:
            inside = subgraph_quantizable_nodes(model)
            where = (
                f"; {len(inside)} sit inside If/Loop/Scan bodies ({', '.join(inside[:5])}"
                f"{', ...' if len(inside) > 5 else ''}), which onnxruntime's quantizer does not reach"
                if inside
                else ""
            )
            raise ValueError(
                f"The model has no quantizable node (op types {', '.join(QUANTIZABLE_OP_TYPES)}) "
                f"in its top-level graph{where}."
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
        approaches = approach_choices(model)
        # Dynamic first: the reference is quantize_dynamic's defaults, the recipe a transformer gets first.
        granularities = GRANULARITIES[::-1] if approaches[0] == "dynamic" else GRANULARITIES
        groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
        if layer_groups is not None:
            kept = set(chosen)
            every = read_layer_groups(model, layer_groups, module_of_node)
            groups = tuple((name, tuple(n for n in group if n in kept)) for name, group in every.items() if kept & set(group))
        transforms = applicable_transforms(model) if scopes & set(TRANSFORMS) else ()
        for name in sorted(scopes & set(TRANSFORMS) - set(transforms)):
            _logger.info("The %s scope is left out of the search: it changes nothing in this model.", name)
        return cls(
            nodes=chosen,
            scopes=scopes,
            # The model's reference also with the scopes off.
            base=QuantConfig(approach=approaches[0], per_channel=granularities[0] == "per_channel"),
            op_types=op_type_choices(model),
            approaches=approaches,
            dynamic_nodes=dynamic_nodes(model),
            weight_types=weight_type_choices(int8_class),
            granularities=granularities,
            groups=groups,
            transforms=transforms,
        )

    def distributions(self) -> dict[str, CategoricalDistribution]:
        """The Optuna distributions of the space, by parameter name."""
        dists: dict[str, CategoricalDistribution] = {}
        if "layer" in self.scopes:
            for unit in self.units():
                dists[LAYER_PREFIX + unit] = CategoricalDistribution(LAYER_CHOICES)
        if "range_estimator" in self.scopes:
            dists["range_estimator"] = CategoricalDistribution(RANGE_ESTIMATORS)
        if "granularity" in self.scopes:
            dists["granularity"] = CategoricalDistribution(self.granularities)
        if "mode" in self.scopes:
            dists["activation_mode"] = CategoricalDistribution(ACTIVATION_MODES)
            dists["weight_mode"] = CategoricalDistribution(WEIGHT_MODES)
        if "op_types" in self.scopes:
            dists["op_types"] = CategoricalDistribution(self.op_types)
        if "approach" in self.scopes and len(self.approaches) > 1:
            dists["approach"] = CategoricalDistribution(self.approaches)
        if "weight_type" in self.scopes and len(self.weight_types) > 1:
            dists["weight_type"] = CategoricalDistribution(self.weight_types)
        for name in self.transforms:
            if name in self.scopes:
                dists[name] = CategoricalDistribution(RECOVERY_CHOICES)
        return dists

    def suggest(self, trial: BaseTrial) -> dict[str, Any]:
        """Ask ``trial`` for every parameter of the space, in a fixed order; those the sampler
        chose together are written in one transaction (:func:`optuna_quant._optuna_private.set_trial_params`)."""
        distributions = self.distributions()
        if isinstance(trial, optuna.Trial):
            set_trial_params(trial, distributions)
        return {name: trial.suggest_categorical(name, dist.choices) for name, dist in distributions.items()}

    def default_params(self) -> dict[str, Any]:
        """The reference configuration's parameters: the first choice of each."""
        return {name: dist.choices[0] for name, dist in self.distributions().items()}

    def to_config(self, params: Mapping[str, Any]) -> QuantConfig:
        """The configuration that ``params`` describe within this space, as its approach builds
        it (:func:`~optuna_quant.quantization.config.effective_config`): params that differ only
        where the approach does not look give equal configurations.

        Raises:
            ValueError: If a parameter is missing or has a value outside its choices.
        """
        distributions = self.distributions()
        for name, dist in distributions.items():
            if name not in params:
                raise ValueError(f"Parameter {name!r} is missing from {dict(params)!r}.")
            if params[name] not in dist.choices:
                raise ValueError(f"Parameter {name!r} has value {params[name]!r}, not one of {dist.choices}.")
        config = self.base
        if "layer" in self.scopes:
            fallback = {n for unit, nodes in self.units().items() if params[LAYER_PREFIX + unit] == "fp32" for n in nodes}
            config = replace(config, fallback=frozenset(fallback | (config.fallback - set(self.nodes))))
        if "range_estimator" in self.scopes:
            config = replace(config, range_estimator=params["range_estimator"])
        if "granularity" in self.scopes:
            config = replace(config, per_channel=params["granularity"] == "per_channel")
        if "mode" in self.scopes:
            config = replace(
                config,
                activation_symmetric=params["activation_mode"] == "symmetric",
                weight_symmetric=params["weight_mode"] == "symmetric",
            )
        if "op_types" in self.scopes:
            config = replace(config, op_types=params["op_types"])
        if "approach" in distributions:
            config = replace(config, approach=params["approach"])
        if "weight_type" in distributions:
            config = replace(config, weight_type=params["weight_type"])
        for name in self.transforms:
            if name in distributions:
                chosen = {name} if params[name] == RECOVERY_CHOICES[1] else set()
                config = replace(config, recovery=frozenset(config.recovery - {name} | chosen))
        return effective_config(config, self.dynamic_nodes)

    def inactive(self) -> dict[str, dict[str, list[str]]]:
        """The parameters that a choice makes inactive, as the samplers take them
        (``set_inactive``): under the dynamic approach, those that :meth:`to_config` ignores.

        Example:
            >>> space = SearchSpace(nodes=("conv", "fc"), approaches=("static", "dynamic"), dynamic_nodes=("fc",))
            >>> space.inactive()
            {'approach': {'dynamic': ['range_estimator', 'activation_mode', 'op_types', 'layer:conv']}}
        """
        distributions = self.distributions()
        approach = distributions.get("approach")
        if approach is None or "dynamic" not in approach.choices:
            return {}
        dynamic = set(self.dynamic_nodes)
        units = [LAYER_PREFIX + unit for unit, nodes in self.units().items() if not dynamic & set(nodes)]
        ignored = [
            name for name in ("range_estimator", "activation_mode", "op_types", *self.transforms, *units) if name in distributions
        ]
        return {"approach": {"dynamic": ignored}} if ignored else {}

    def narrow(self, best: QuantConfig, scopes: Iterable[str]) -> SearchSpace:
        """A space around ``best`` in which only ``scopes`` vary (POT's ``fine_tune``)."""
        return replace(self, scopes=frozenset(scopes), base=best)

    def to_dict(self) -> dict[str, Any]:
        """The space as JSON-serialisable data, stored with the study."""
        return {
            "nodes": list(self.nodes),
            "scopes": sorted(self.scopes),
            "op_types": list(self.op_types),
            "approaches": list(self.approaches),
            "dynamic_nodes": list(self.dynamic_nodes),
            "weight_types": list(self.weight_types),
            "granularities": list(self.granularities),
            "groups": {name: list(nodes) for name, nodes in self.groups},
            "transforms": list(self.transforms),
            "base": {
                "fallback": sorted(self.base.fallback),
                "approach": self.base.approach,
                "range_estimator": self.base.range_estimator,
                "per_channel": self.base.per_channel,
                "activation_symmetric": self.base.activation_symmetric,
                "weight_symmetric": self.base.weight_symmetric,
                "op_types": self.base.op_types,
                "weight_type": self.base.weight_type,
                "recovery": sorted(self.base.recovery),
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SearchSpace:
        """The space stored by :meth:`to_dict`."""
        base = dict(data["base"])
        base["fallback"] = frozenset(base["fallback"])
        base["recovery"] = frozenset(base.get("recovery", ()))
        return cls(
            nodes=tuple(data["nodes"]),
            scopes=frozenset(data["scopes"]),
            base=QuantConfig(**base),
            op_types=tuple(data["op_types"]),
            # Spaces stored before the approach scope: static only.
            approaches=tuple(data.get("approaches", APPROACHES[:1])),
            dynamic_nodes=tuple(data.get("dynamic_nodes", ())),
            weight_types=tuple(data.get("weight_types", WEIGHT_TYPES[:1])),
            granularities=tuple(data.get("granularities", GRANULARITIES)),
            groups=tuple((name, tuple(nodes)) for name, nodes in data.get("groups", {}).items()),
            # Spaces stored before the recovery transforms: none.
            transforms=tuple(data.get("transforms", ())),
        )
