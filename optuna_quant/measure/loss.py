"""Accuracy loss, latency gain and OpenVINO POT's weighted loss.

The formulas follow POT's TPE algorithm exactly: the accuracy term is ``exp(acc_loss)``, the latency
term ``ln((1 / (1000 * lat_diff)) ** 8)``, both scaled to a span of 10 by a reference trial (the
default configuration), with a penalty of 80 for a missed accuracy target and 40 for a missed
latency target.

One guard departs from POT. POT's latency scale ``10 / |L(1) - L(l0)|`` is ``10 / (8 |ln l0|)``,
which grows without bound as the reference's speed-up ``l0`` nears 1 (208 on a real text
recognizer whose reference ran at 1.006x): a hundredth of speed-up then outweighs tens of points
of accuracy. POT itself sets ``l0 == 1`` aside and scales by ``L(2)`` instead. Here every reference
within :data:`SPEEDUP_NOISE` of fp32's speed (``|ln l0| < ln 1.1``, that is ``1 / 1.1 < l0 < 1.1``)
is treated like ``l0 == 1``: such a speed-up is within what a loaded machine's timing moves it
by, and the scale is at most ``10 / (8 ln 1.1) = 13.1`` outside that band. Everywhere else the
scaling is POT's, to the bit.

Example:
    >>> from optuna_quant.measure.loss import LossScaling, Targets, weighted_loss
    >>> targets = Targets(accuracy_loss=1.0, latency_reduce=1.5)
    >>> scaling = LossScaling.from_reference(acc_loss=0.02, lat_diff=2.0, targets=targets)
    >>> round(weighted_loss(0.005, 4.0, targets, scaling), 4)  # twice the reference speed-up
    -10.0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from dataclasses import dataclass
import logging
import math
from typing import Any


_logger = logging.getLogger(__name__)

SPEEDUP_NOISE = 1.1
"""A reference whose speed-up ``l0`` lies strictly between ``1 / SPEEDUP_NOISE`` and
``SPEEDUP_NOISE`` scales the latency term as POT's ``l0 == 1`` does, by ``L(2)``."""


@dataclass(frozen=True)
class Targets:
    """The accuracy and latency targets of a run, with POT's option names.

    Args:
        accuracy_loss: Largest acceptable relative accuracy loss, in percent.
        latency_reduce: Wanted speed-up, ``fp32_latency / int8_latency``.
        accuracy_weight: Weight of the accuracy term in the loss.
        latency_weight: Weight of the latency term in the loss.
    """

    accuracy_loss: float = 1.0
    latency_reduce: float = 1.0
    accuracy_weight: float = 1.0
    latency_weight: float = 1.0

    def __post_init__(self) -> None:
        for name in ("accuracy_loss", "latency_reduce", "accuracy_weight", "latency_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}.")
        if not 0 < self.accuracy_loss < 100:
            raise ValueError(
                f"accuracy_loss is a percentage and must lie in (0, 100), got {self.accuracy_loss!r}."
            )
        if not 0 < self.latency_reduce <= 100:
            raise ValueError(
                "latency_reduce is fp32_latency / int8_latency and must lie in (0, 100], "
                f"got {self.latency_reduce!r}."
            )
        for name in ("accuracy_weight", "latency_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)!r}.")

    @property
    def acc_th(self) -> float:
        """The accuracy threshold as a fraction, ``accuracy_loss / 100``."""
        return self.accuracy_loss / 100.0

    @property
    def lat_th(self) -> float:
        """The latency threshold, ``latency_reduce``."""
        return float(self.latency_reduce)

    def accuracy_met(self, acc_loss: float) -> bool:
        """Whether ``acc_loss`` is within the accuracy target."""
        return acc_loss <= self.acc_th

    def met(self, acc_loss: float, lat_diff: float, quantized: bool = True) -> bool:
        """Whether both targets are met; never by a model that quantizes nothing (the fp32 model),
        whose ``lat_diff`` reads about 1 and would meet a ``latency_reduce`` of 1 by timing noise."""
        return quantized and self.accuracy_met(acc_loss) and lat_diff >= self.lat_th

    def constraints(self, acc_loss: float, lat_diff: float, quantized: bool = True) -> dict[str, float]:
        """Both targets as Optuna constraints, met where ``<= 0``; a model that quantizes nothing
        counts as no int8 speed-up at all, so that no sampler takes the fp32 model as feasible.

        Example:
            >>> Targets(accuracy_loss=1.0, latency_reduce=2.0).constraints(0.005, 2.5)
            {'accuracy': -0.005, 'latency': -0.5}
            >>> Targets(accuracy_loss=1.0, latency_reduce=1.0).constraints(0.0, 1.002, quantized=False)
            {'accuracy': -0.01, 'latency': 1.0}
        """
        return {"accuracy": acc_loss - self.acc_th, "latency": self.lat_th - (lat_diff if quantized else 0.0)}

    def missed(self, acc_loss: float, lat_diff: float, quantized: bool = True) -> list[str]:
        """Names of the targets that a result misses, in POT's order (accuracy first); a model that
        quantizes nothing misses the latency target (:meth:`met`)."""
        misses = []
        if not self.accuracy_met(acc_loss):
            misses.append("accuracy")
        if lat_diff < self.lat_th or not quantized:
            misses.append("latency")
        return misses

    def shortfall(self, acc_loss: float, lat_diff: float, quantized: bool = True) -> list[str]:
        """What a result misses of each target and by how much, one phrase a missed target.

        Example:
            >>> Targets(accuracy_loss=1.0, latency_reduce=1.5).shortfall(0.0171, 1.21)
            ['accuracy missed by 0.71 points of acc_loss (1.71 % against the 1.00 % target)', 'latency missed: 1.21x against 1.50x']
            >>> Targets(accuracy_loss=1.0, latency_reduce=1.0).shortfall(0.0, 1.002, quantized=False)
            ['latency missed: the configuration quantizes nothing, it is the fp32 model']
        """
        phrases = []
        if not self.accuracy_met(acc_loss):
            phrases.append(
                f"accuracy missed by {100 * (acc_loss - self.acc_th):.2f} points of acc_loss "
                f"({100 * acc_loss:.2f} % against the {self.accuracy_loss:.2f} % target)"
            )
        if not quantized:
            phrases.append("latency missed: the configuration quantizes nothing, it is the fp32 model")
        elif lat_diff < self.lat_th:
            slower = ", slower than fp32" if lat_diff < 1 else ""
            phrases.append(f"latency missed: {lat_diff:.2f}x against {self.lat_th:.2f}x{slower}")
        return phrases

    def to_dict(self) -> dict[str, float]:
        """The targets as a JSON-serialisable dict."""
        return asdict(self)


def relative_accuracy_loss(fp32_accuracy: float, int8_accuracy: float) -> float:
    """``(fp32_accuracy - int8_accuracy) / fp32_accuracy``; lower is better.

    Raises:
        ValueError: If ``fp32_accuracy`` is zero, where a relative loss means nothing.
    """
    if fp32_accuracy == 0:
        raise ValueError("The fp32 accuracy is 0: a relative accuracy loss cannot be computed.")
    return (fp32_accuracy - int8_accuracy) / fp32_accuracy


def latency_term(lat_diff: float) -> float:
    """POT's latency term ``L(l) = ln((1 / (1000 * l)) ** 8)``, written as ``-8 ln(1000 l)``."""
    return -8.0 * math.log(1000.0 * lat_diff)


@dataclass(frozen=True)
class LossScaling:
    """The scaling of the two loss terms, set once per study by the reference trial.

    Every worker and every warm start must use the same scaling, so it is stored with the study
    (:meth:`to_dict` / :meth:`from_dict`).
    """

    acc_min: float
    acc_max: float
    acc_scale: float
    lat_min: float
    lat_max: float
    lat_scale: float

    @classmethod
    def from_reference(cls, acc_loss: float, lat_diff: float, targets: Targets) -> LossScaling:
        """The scaling from the reference trial's ``acc_loss`` (a0) and ``lat_diff`` (l0).

        POT's, except that a reference within :data:`SPEEDUP_NOISE` of fp32's speed is scaled as
        POT scales ``l0 == 1`` (see the module's docstring).

        Example:
            >>> s = LossScaling.from_reference(0.0, 1.0, Targets(accuracy_loss=1.0))
            >>> round(s.acc_max, 6), round(s.lat_min, 4)
            (1.01005, -60.8072)
            >>> LossScaling.from_reference(0.0, 1.006, Targets()) == s  # POT: lat_scale 208
            True
        """
        if not lat_diff > 0:
            raise ValueError(f"The reference lat_diff must be positive, got {lat_diff!r}.")
        acc_min = 1.0
        acc_max = math.exp(targets.acc_th) if acc_loss == 0 else math.exp(acc_loss)
        lat_max = latency_term(1.0)
        no_speedup = abs(math.log(lat_diff)) < math.log(SPEEDUP_NOISE)
        if no_speedup and lat_diff != 1:
            _logger.warning(
                "The reference lat_diff %.4f is within %.0f %% of fp32's speed: the latency term is "
                "scaled by a speed-up of 2, as POT does for a reference without speed-up "
                "(POT's formula would scale it by %.1f).",
                lat_diff,
                100 * (SPEEDUP_NOISE - 1),
                10.0 / abs(latency_term(1.0) - latency_term(lat_diff)),
            )
        lat_min = latency_term(2.0) if no_speedup else latency_term(lat_diff)
        return cls(
            acc_min=acc_min,
            acc_max=acc_max,
            acc_scale=10.0 / abs(acc_max - acc_min),
            lat_min=lat_min,
            lat_max=lat_max,
            lat_scale=10.0 / abs(lat_max - lat_min),
        )

    def to_dict(self) -> dict[str, float]:
        """The scaling as a JSON-serialisable dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LossScaling:
        """The scaling stored by :meth:`to_dict`."""
        return cls(**{key: float(data[key]) for key in cls.__dataclass_fields__})


def weighted_loss(
    acc_loss: float, lat_diff: float, targets: Targets, scaling: LossScaling, quantized: bool = True
) -> float:
    """POT's weighted loss of one result; minimise it.

    The accuracy term counts only while the accuracy target is missed, so that among the models
    that keep their accuracy the fastest wins. A model that quantizes nothing misses the latency
    target (:meth:`Targets.met`) and takes its penalty.
    """
    missed_accuracy = not targets.accuracy_met(acc_loss)
    w_a = targets.accuracy_weight if missed_accuracy else 0.0
    if w_a == 0 and targets.latency_weight == 0:
        w_a = 1.0
    loss = w_a * scaling.acc_scale * (math.exp(acc_loss) - scaling.acc_min)
    loss += targets.latency_weight * scaling.lat_scale * (latency_term(lat_diff) - scaling.lat_min)
    if missed_accuracy:
        loss += 80.0
    elif lat_diff < targets.lat_th or not quantized:
        loss += 40.0
    return loss


@dataclass(frozen=True)
class Result:
    """One evaluated configuration: what the best-result rule looks at."""

    acc_loss: float
    lat_diff: float
    loss: float
    quantized: bool = True


def best_index(results: Sequence[Result], targets: Targets) -> int | None:
    """Index of the best result, or ``None`` when ``results`` is empty.

    Among the results within the accuracy target, the highest ``lat_diff`` wins (ties: the lower
    ``acc_loss``): POT's rule. When none is within it, the result closest to the accuracy target
    wins (the lowest ``acc_loss``; ties: the higher ``lat_diff``) among those a user could use
    instead of the fp32 model, the ones at least as fast (``lat_diff >= 1``), or among all when
    none is. POT took the lowest loss there, which a latency scale from a reference near fp32's
    speed can hand to a fast model that lost most of its accuracy. A model that quantizes nothing
    (the fp32 model) wins only when no result quantizes anything.

    Example:
        >>> t = Targets(accuracy_loss=1.0)
        >>> best_index([Result(0.02, 3.0, 90.0), Result(0.005, 1.5, 1.0), Result(0.001, 1.2, 2.0)], t)
        1
        >>> best_index([Result(0.287, 1.3, 80.1), Result(0.081, 1.1, 80.9), Result(0.02, 0.8, 95.0)], t)
        1
    """
    if not results:
        return None
    pool = [i for i, r in enumerate(results) if r.quantized] or range(len(results))
    feasible = [i for i in pool if targets.accuracy_met(results[i].acc_loss)]
    if feasible:
        return max(feasible, key=lambda i: (results[i].lat_diff, -results[i].acc_loss))
    usable = [i for i in pool if results[i].lat_diff >= 1] or pool
    return min(usable, key=lambda i: (results[i].acc_loss, -results[i].lat_diff))
