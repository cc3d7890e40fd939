"""The benchmark's workloads by name, with the latency target each study aims at.

Example:
    >>> sorted(WORKLOADS)
    ['ddddocr', 'minilm', 'mnist_demo', 'mtcnn_onet', 'mtcnn_rnet', 'ppocr', 'silero_vad']
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from benchmarks.real_models.base import Workload
from benchmarks.real_models.digits import mnist_demo
from benchmarks.real_models.faces import mtcnn
from benchmarks.real_models.ocr import ddddocr
from benchmarks.real_models.ocr import ppocr
from benchmarks.real_models.retrieval import minilm_retrieval
from benchmarks.real_models.speech import silero_vad


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "ddddocr": ddddocr,
    "ppocr": ppocr,
    "mtcnn_onet": partial(mtcnn, "ONet"),
    "mtcnn_rnet": partial(mtcnn, "RNet"),
    "silero_vad": silero_vad,
    "minilm": minilm_retrieval,
    "mnist_demo": mnist_demo,
}
# The latency target of each study, set from the smoke runs (docs/real-models.md): a little above
# the best baseline within 1 % (ddddocr 1.31, silero_vad 1.39, minilm 2.12 by quantize_dynamic),
# and "not slower than fp32" where no baseline is faster (ppocr 0.70, the MTCNN networks 0.94);
# the demo's own target for its model.
LATENCY_TARGETS = {
    "ddddocr": 1.5, "ppocr": 1.0, "mtcnn_onet": 1.0, "mtcnn_rnet": 1.0, "silero_vad": 1.6, "minilm": 2.2, "mnist_demo": 1.5,
}


def build(name: str, **sizes: int) -> Workload:
    """The workload ``name``, with optional ``n_eval``, ``n_calibration`` and ``seed``.

    Raises:
        ValueError: For an unknown name, listing the known ones.
    """
    if name not in WORKLOADS:
        raise ValueError(f"Unknown model {name!r}; choose from {sorted(WORKLOADS)}.")
    return WORKLOADS[name](**sizes)
