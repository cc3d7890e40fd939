"""Accuracy evaluation: the user's ``eval_fn`` contract and a built-in top-1 evaluator.

An ``eval_fn`` takes an ``onnxruntime.InferenceSession`` and returns a float, higher is better.
To honour ``eval_subset_size`` (POT: evaluate on the first N samples only), it also accepts a
``subset_size`` keyword; :class:`Top1Accuracy` does. One that also scores its samples a batch at a
time (:class:`SampleScores`, as :class:`Top1Accuracy` does) lets a pruned study stop evaluating a
model once its accuracy is confidently over the target (:mod:`optuna_quant.measure.paired`).

Example:
    >>> import numpy as np
    >>> evaluate = Top1Accuracy(np.zeros((4, 3), np.float32), np.array([0, 1, 2, 0]))
    >>> evaluate.n_samples
    4
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
import inspect
import math
from typing import Any
from typing import Protocol
from typing import runtime_checkable

import numpy as np
import onnxruntime as ort


EvalFn = Callable[..., float]


@runtime_checkable
class SampleScores(Protocol):
    """An ``eval_fn`` that also yields its per-sample scores, one batch at a time, in a fixed order.

    The mean of every score it yields for a session is what calling it returns for that session.
    """

    def __call__(self, session: ort.InferenceSession, subset_size: int | None = None) -> float: ...

    def sample_scores(self, session: ort.InferenceSession, subset_size: int | None = None) -> Iterator[np.ndarray]:
        """Each batch's per-sample scores (higher is better), the same samples in the same order every call."""
        ...


class Top1Accuracy:
    """Top-1 accuracy of a classifier on ``(inputs, labels)``.

    Args:
        inputs: An array of samples (batch axis first) for a single-input model.
        labels: Integer class labels, one per sample.
        batch_size: Samples per ``session.run`` call.
    """

    def __init__(self, inputs: np.ndarray, labels: np.ndarray, batch_size: int = 500) -> None:
        self.inputs = np.asarray(inputs)
        self.labels = np.asarray(labels)
        if len(self.inputs) != len(self.labels) or len(self.labels) == 0:
            raise ValueError(
                f"eval_data has {len(self.inputs)} inputs and {len(self.labels)} labels; "
                "they must be equally many, and at least one."
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size!r}.")
        self.batch_size = batch_size

    @property
    def n_samples(self) -> int:
        """The number of samples."""
        return len(self.labels)

    def __call__(self, session: ort.InferenceSession, subset_size: int | None = None) -> float:
        """The fraction of the first ``subset_size`` samples (all by default) classified right."""
        hits = np.concatenate(list(self.sample_scores(session, subset_size)))
        return float(np.sum(hits)) / len(hits)

    def sample_scores(self, session: ort.InferenceSession, subset_size: int | None = None) -> Iterator[np.ndarray]:
        """Per batch of the first ``subset_size`` samples: 1.0 where the sample is classified right, else 0.0."""
        n = self.n_samples if subset_size is None else min(subset_size, self.n_samples)
        input_name = session.get_inputs()[0].name
        for start in range(0, n, self.batch_size):
            stop = min(start + self.batch_size, n)
            logits = session.run(None, {input_name: self.inputs[start:stop]})[0]
            yield (np.argmax(logits, axis=-1) == self.labels[start:stop]).astype(np.float64)


def eval_function(eval_fn: EvalFn | None, eval_data: tuple[Any, Any] | None) -> EvalFn:
    """``eval_fn``, or the :class:`Top1Accuracy` of ``eval_data`` ``(inputs, labels)``.

    Raises:
        ValueError: Unless exactly one of the two is given.
    """
    if (eval_fn is None) == (eval_data is None):
        raise ValueError("Give exactly one of eval_fn and eval_data.")
    return eval_fn if eval_data is None else Top1Accuracy(*eval_data)


def accepts_subset_size(eval_fn: EvalFn) -> bool:
    """Whether ``eval_fn`` takes the ``subset_size`` keyword."""
    try:
        parameters = inspect.signature(eval_fn).parameters
    except (TypeError, ValueError):
        return False
    return "subset_size" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


def checked_score(value: Any, what: str) -> float:
    """``value`` as a finite float, or a ``ValueError`` that says what returned it."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise ValueError(f"{what} returned {value!r} ({type(value).__name__}), not a number.")
    if not math.isfinite(float(value)):
        raise ValueError(f"{what} returned {value!r}, not a finite number.")
    return float(value)
