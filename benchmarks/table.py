"""Quantization tables: every configuration of a search space, measured once.

A table lets a sampler benchmark replay thousands of studies in seconds: the objective looks a
configuration up instead of quantizing and measuring a model. The JSON schema is shared with the
sampler authors, so keep to it::

    {"name": str, "description": str,
     "params": {name: [choices...]},
     "reference": {name: first choice},
     "targets": {"accuracy_loss": percent, "latency_reduce": float},
     "fp32": {"accuracy": float, "latency_ms": float},
     "rows": [{"params": {...}, "accuracy": float, "acc_loss": float, "lat_diff": float,
               "quantized": bool}, ...]}

``rows`` covers every configuration of the space. Each row says whether its model runs anything
in int8 (``"quantized"``; a row without it does): one that does not is the fp32 model, which
meets no target, as in a study (``optuna_quant.measure.loss.Targets.met``). Optionally, per-layer
measurements that a sampler may take as a prior::

     "layer_sensitivity_standin": {layer_param: {"acc_loss": float, "lat_diff": float}},
     "scope_errors": [{"params": {scope_param: choice}, "error": float, "lat_diff": float}, ...],
     "base_sensitivity": {"params": {scope_param: choice},
                          "layers": {layer_param: {"error_alone": float, "error_recovered": float,
                                                   "fp32_ms": float, "int8_ms": float,
                                                   "revert_cost": float}},
                          "pairs": [{"layers": [layer, layer], "error_recovered": float}, ...]}

``layer_sensitivity_standin`` is the row of the configuration that differs from the default one
in that layer alone (fp32), read from the table's rows: the stand-in used before tables carried
the real measurement. ``scope_errors`` holds, for every combination of the other parameters
(range estimator, granularity, mode; the reference's first) with every layer int8, the output
error against fp32 on the calibration samples (``optuna_quant.measure.sensitivity.measure_scope_errors``)
and, in tables measured since, the kernels' speed-up (``lat_diff``, ``measure_kernel_speed``);
``base_sensitivity`` is ``optuna_quant.measure.sensitivity.measure_sensitivity`` run on the table's
model, calibration data and quantizer at the base combination (``optuna_quant.trial.scoring.base_combination``:
the lowest of these errors where the reference misses the accuracy target, as on every table)
(``LayerSensitivity.to_dict()`` per layer), with the joint revert of the adjacent pairs that it
leaves ambiguous (``optuna_quant.measure.interactions.measure_pairs``; absent in tables measured
before).

Example:
    >>> table = Table.from_rows(
    ...     name="tiny", description="two params", params={"a": ["x", "y"], "b": ["u", "v"]},
    ...     targets={"accuracy_loss": 1.0, "latency_reduce": 1.5}, fp32={"accuracy": 1.0, "latency_ms": 1.0},
    ...     rows=[{"params": {"a": a, "b": b}, "accuracy": 1.0, "acc_loss": 0.0, "lat_diff": 2.0}
    ...           for a in "xy" for b in "uv"])
    >>> table.size, table.lookup({"a": "y", "b": "u"})["lat_diff"]
    (4, 2.0)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from dataclasses import field
from functools import cached_property
import itertools
import json
import math
from pathlib import Path
from typing import Any

from optuna_quant.measure.loss import LossScaling
from optuna_quant.measure.loss import Targets
from optuna_quant.measure.loss import weighted_loss


TABLES_DIR = Path(__file__).resolve().parent / "tables"

Key = tuple[Any, ...]


def quantized(row: dict[str, Any]) -> bool:
    """Whether a row's model runs anything in int8; rows measured before tables recorded it did."""
    return bool(row.get("quantized", True))


@dataclass(frozen=True)
class Table:
    """One measured search space.

    Attributes:
        name: Short name, also the JSON file's stem.
        description: Model, data, how the table was made and the command that rebuilt it.
        params: Choices of every parameter; the first choice is the default configuration's.
        targets: ``{"accuracy_loss": percent, "latency_reduce": float}``.
        fp32: ``{"accuracy": float, "latency_ms": float}`` of the fp32 model.
        rows: One dict per configuration with ``params``, ``accuracy``, ``acc_loss``, ``lat_diff``
            and ``quantized`` (whether its model runs anything in int8; true where absent).
        layer_sensitivity_standin: Per layer parameter, ``acc_loss`` and ``lat_diff`` of the
            default configuration with that layer alone in fp32; ``None`` when not measured.
        scope_errors: The all-int8 output error of every combination of the other parameters.
        base_sensitivity: The per-layer sensitivity at the combination of the other parameters
            with the lowest output error (``params``), by layer parameter (``layers``).
    """

    name: str
    description: str
    params: dict[str, list[Any]]
    targets: dict[str, float]
    fp32: dict[str, float]
    rows: list[dict[str, Any]]
    layer_sensitivity_standin: dict[str, dict[str, float]] | None = None
    scope_errors: list[dict[str, Any]] | None = None
    base_sensitivity: dict[str, Any] | None = None
    _index: dict[Key, dict[str, Any]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index = {self.key(row["params"]): row for row in self.rows}
        missing = self.size - len(index)
        if len(self.rows) != self.size or missing:
            raise ValueError(
                f"Table {self.name!r} must hold every one of its {self.size} configurations once; "
                f"it has {len(self.rows)} rows for {len(index)} distinct configurations."
            )
        object.__setattr__(self, "_index", index)
        named = {
            "scope_errors": {name for entry in self.scope_errors or () for name in entry["params"]},
            "base_sensitivity": set(self.base_sensitivity["params"]) | set(self.base_sensitivity["layers"])
            if self.base_sensitivity
            else set(),
        }
        for key, names in named.items():
            unknown = sorted(names - set(self.params))
            if unknown:
                raise ValueError(f"Table {self.name!r}: {key} names {unknown}, which are not parameters of the table.")

    @classmethod
    def from_rows(cls, **fields: Any) -> Table:
        """A table from its JSON fields; ``reference`` is derived, so it is ignored if given."""
        fields.pop("reference", None)
        return cls(**fields)

    @classmethod
    def load(cls, path: str | Path) -> Table:
        """Read a table from its JSON file."""
        return cls.from_rows(**json.loads(Path(path).read_text()))

    def save(self, path: str | Path) -> None:
        """Write the table as compact JSON (one row a line, so that diffs stay readable)."""
        head = {
            "name": self.name,
            "description": self.description,
            "params": self.params,
            "reference": self.reference,
            "targets": self.targets,
            "fp32": self.fp32,
        }
        for key in ("layer_sensitivity_standin", "scope_errors", "base_sensitivity"):
            if getattr(self, key) is not None:
                head[key] = getattr(self, key)
        body = json.dumps(head, indent=1)[:-2]
        rows = ",\n".join(json.dumps(row, separators=(",", ":")) for row in self.rows)
        Path(path).write_text(f'{body},\n "rows": [\n{rows}\n ]\n}}\n')

    @cached_property
    def names(self) -> list[str]:
        """Parameter names, sorted: the order in which the runner suggests them."""
        return sorted(self.params)

    @property
    def size(self) -> int:
        """Number of configurations of the space."""
        return math.prod(len(choices) for choices in self.params.values())

    @cached_property
    def reference(self) -> dict[str, Any]:
        """The default configuration: the first choice of every parameter."""
        return {name: self.params[name][0] for name in self.names}

    @cached_property
    def target(self) -> Targets:
        """The run's targets as the project's :class:`Targets`."""
        return Targets(
            accuracy_loss=float(self.targets["accuracy_loss"]),
            latency_reduce=float(self.targets["latency_reduce"]),
        )

    @cached_property
    def scaling(self) -> LossScaling:
        """POT's loss scaling, set by the reference configuration."""
        ref = self.lookup(self.reference)
        return LossScaling.from_reference(ref["acc_loss"], ref["lat_diff"], self.target)

    def key(self, params: dict[str, Any]) -> Key:
        """A hashable key of a configuration."""
        return tuple(params[name] for name in self.names)

    def lookup(self, params: dict[str, Any]) -> dict[str, Any]:
        """The measured row of a configuration."""
        return self.row_at(self.key(params))

    def loss(self, params: dict[str, Any]) -> float:
        """POT's weighted loss of a configuration."""
        row = self.lookup(params)
        return weighted_loss(row["acc_loss"], row["lat_diff"], self.target, self.scaling, quantized(row))

    def row_at(self, key: Key) -> dict[str, Any]:
        """The measured row of the configuration with key ``key`` (:meth:`key`)."""
        return self._index[key]

    def met(self, row: dict[str, Any]) -> bool:
        """Whether a row meets both targets (one that quantizes nothing never does)."""
        return self.target.met(row["acc_loss"], row["lat_diff"], quantized(row))

    def usable(self, row: dict[str, Any]) -> bool:
        """Whether a row is an int8 model within the accuracy target, whatever its speed."""
        return quantized(row) and self.target.accuracy_met(row["acc_loss"])

    def constraints(self, row: dict[str, Any]) -> dict[str, float]:
        """Both targets as Optuna constraints of a row, as a study records them."""
        return self.target.constraints(row["acc_loss"], row["lat_diff"], quantized(row))

    def with_layer_standin(self) -> Table:
        """This table with :attr:`layer_sensitivity_standin` read from its single-layer rows.

        Each layer parameter (``layer:<node>``) gets the ``acc_loss`` and ``lat_diff`` of the
        default configuration with that layer alone in fp32, the cheap measurement (one
        configuration per layer) that a study can make before searching.
        """
        standin = {}
        for name in self.names:
            if name.startswith("layer:") and "fp32" in self.params[name]:
                row = self.lookup({**self.reference, name: "fp32"})
                standin[name] = {"acc_loss": row["acc_loss"], "lat_diff": row["lat_diff"]}
        return dataclasses.replace(self, layer_sensitivity_standin=standin)

    @cached_property
    def feasible_fraction(self) -> float:
        """Fraction of configurations that meet both targets."""
        return sum(self.met(row) for row in self.rows) / self.size

    @cached_property
    def best_lat_diff(self) -> float | None:
        """The highest ``lat_diff`` among int8 configurations within the accuracy target."""
        within = [r["lat_diff"] for r in self.rows if self.usable(r)]
        return max(within, default=None)

    @cached_property
    def min_loss(self) -> float:
        """The lowest loss of any configuration: where a best-so-far curve ends at best."""
        return min(self.loss(row["params"]) for row in self.rows)


def configurations(params: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every configuration of a space, as dicts with the parameters in sorted order."""
    names = sorted(params)
    return [dict(zip(names, values)) for values in itertools.product(*(params[n] for n in names))]


def table_paths(names: list[str] | None = None, directory: Path = TABLES_DIR) -> list[Path]:
    """The JSON tables under ``directory``, all or the ones whose stem is in ``names``."""
    paths = sorted(directory.glob("*.json"))
    if names is None:
        return paths
    by_stem = {path.stem: path for path in paths}
    unknown = sorted(set(names) - set(by_stem))
    if unknown:
        raise ValueError(f"Unknown tables {unknown}; {directory} has {sorted(by_stem)}.")
    return [by_stem[name] for name in names]
