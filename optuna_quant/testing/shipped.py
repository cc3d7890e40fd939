"""ONNX models that PyPI wheels ship, unmodified, with inputs of the kind each one reads.

The tests and ``benchmarks/bench_prepare.py`` try every stage on them as a new user would:
ddddocr's OCR recognizer and detector (opset 12 and 11), rapidocr-onnxruntime's PP-OCR models
(opset 11 and 12, a ``dim_value: -1`` batch, 51 Conv/MatMul layers in the recognizer, 35
BatchNormalization nodes in the direction classifier) and silero-vad's voice-activity models
(LSTM, ``If`` bodies). Install them without their dependencies (they would pull torch or
OpenCV, which only their Python wrappers use)::

    pip install --no-deps ddddocr==1.6.1 rapidocr-onnxruntime==1.4.4 silero-vad==6.2.3

The inputs are rendered text lines (PIL's default font) for the OCR models and synthesized tones
in noise for the VAD models: real inputs of the right kind and range, not an evaluation set.

Example:
    >>> model = SHIPPED["rapidocr_rec"]
    >>> model.path() is None or model.path().suffix == ".onnx"
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
import importlib.util
from pathlib import Path

import numpy as np

from optuna_quant.quantization.model_io import Feed


def text_line(text: str, height: int, width: int, channels: int) -> np.ndarray:
    """``text`` rendered black on white, as a ``(1, channels, height, width)`` float array in [0, 1]."""
    from PIL import Image
    from PIL import ImageDraw
    from PIL import ImageFont

    image = Image.new("L", (width, height), 255)
    ImageDraw.Draw(image).text((4, height // 4), text, fill=0, font=ImageFont.load_default(size=height // 2))
    pixels = np.asarray(image, np.float32) / 255.0
    return np.repeat(pixels[None, None], channels, axis=1)


def speech_like(index: int, samples: int) -> np.ndarray:
    """A tone whose pitch depends on ``index``, in a little noise, 16 kHz, amplitude about 0.3."""
    rng = np.random.default_rng(index)
    t = np.arange(samples, dtype=np.float32) / 16000
    tone = np.sin(2 * np.pi * (120 + 40 * index) * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return (0.3 * tone + 0.02 * rng.standard_normal(samples)).astype(np.float32)


_WORDS = ("optuna", "int8", "Quant", "2026", "model", "ONNX", "search", "layer")


def _word(index: int) -> str:
    return f"{_WORDS[index % len(_WORDS)]} {index:03d}"


@dataclass(frozen=True)
class ShippedModel:
    """One ONNX file of an installed wheel and the inputs it takes.

    Attributes:
        package: The import name of the package that ships the file.
        file: The file's path inside the package.
        feed: Builds the ``index``-th input dict.
    """

    package: str
    file: str
    feed: Callable[[int], Feed]

    def path(self) -> Path | None:
        """The file's path, or ``None`` when the package is not installed."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or spec.origin is None:
            return None
        return Path(spec.origin).parent / self.file

    def feeds(self, count: int) -> list[Feed]:
        """The first ``count`` input dicts."""
        return [self.feed(index) for index in range(count)]


def _vad_state(index: int) -> Feed:
    return {
        "input": speech_like(index, 512)[None],
        "state": np.zeros((2, 1, 128), np.float32),
        "sr": np.array(16000, np.int64),
    }


SHIPPED: dict[str, ShippedModel] = {
    "ddddocr_rec": ShippedModel(
        "ddddocr", "common.onnx", lambda i: {"input1": text_line(_word(i), 64, 160, 1)}
    ),
    "ddddocr_det": ShippedModel(
        "ddddocr", "common_det.onnx", lambda i: {"images": text_line(_word(i), 416, 416, 3)}
    ),
    "rapidocr_rec": ShippedModel(
        "rapidocr_onnxruntime",
        "models/ch_PP-OCRv4_rec_infer.onnx",
        lambda i: {"x": (text_line(_word(i), 48, 320, 3) - 0.5) / 0.5},
    ),
    "rapidocr_cls": ShippedModel(
        "rapidocr_onnxruntime",
        "models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        lambda i: {"x": (text_line(_word(i), 48, 192, 3) - 0.5) / 0.5},
    ),
    "silero_vad_sequence": ShippedModel(
        "silero_vad",
        "data/silero_vad_16k_sequence.onnx",
        lambda i: {
            "input": speech_like(i, 8 * 576).reshape(8, 576),
            "h": np.zeros((1, 1, 128), np.float32),
            "c": np.zeros((1, 1, 128), np.float32),
        },
    ),
    "silero_vad_op15": ShippedModel("silero_vad", "data/silero_vad_16k_op15.onnx", _vad_state),
    "silero_vad": ShippedModel("silero_vad", "data/silero_vad.onnx", _vad_state),
}
"""The shipped models by a short name."""
