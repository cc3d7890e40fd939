"""The two OCR recognizers: ddddocr's and RapidOCR's PP-OCRv4, scored on rendered text.

Both files are used as their wheels ship them (opset 12, a symbolic or ``-1`` width). The
evaluation renders random strings from each model's own charset (:mod:`.text`) and scores the
mean character accuracy of the CTC-decoded reading against the string drawn.

Example:
    >>> workload = ddddocr(n_eval=8, n_calibration=2, seed=0)  # doctest: +SKIP
    >>> workload.eval_fn(session(workload.onnx_model()))         # doctest: +SKIP
    0.97
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
import string

import numpy as np
import onnx
import onnxruntime as ort

from benchmarks.real_models.base import Workload
from benchmarks.real_models.text import char_accuracy
from benchmarks.real_models.text import ctc_greedy
from benchmarks.real_models.text import random_strings
from benchmarks.real_models.text import render_lines
from benchmarks.real_models.wheels import load_module_file
from benchmarks.real_models.wheels import shipped_file


DDDDOCR_HEIGHT, DDDDOCR_WIDTH = 64, 192
PPOCR_HEIGHT, PPOCR_WIDTH = 48, 320
# Glyphs that are the same shape in some fonts (o/0, l/1/i): no reader can tell them apart.
LOOKALIKES = set("oO0lI1i")
EVAL_SEED_OFFSET = 1000  # evaluation lines come from another random stream than calibration lines


class TextScore:
    """``eval_fn``: the mean character accuracy of a recognizer on rendered lines, case-blind.

    Case-blind, because in many fonts c, k, p, s, u, v, w, x and z differ from their capitals
    by size alone, which a line recognizer cannot see.

    Args:
        images: Model inputs, one line each (batch 1).
        truths: The strings drawn.
        charset: Index -> character of the model's output classes (0 is the CTC blank).
        logits: Turns the model's first output into ``(steps, classes)`` scores.
    """

    def __init__(
        self,
        images: Sequence[np.ndarray],
        truths: Sequence[str],
        charset: Sequence[str],
        logits: Callable[[np.ndarray], np.ndarray],
    ) -> None:
        self.images, self.truths, self.charset, self.logits = list(images), list(truths), charset, logits

    def read(self, session: ort.InferenceSession) -> list[str]:
        """What ``session`` reads on each line."""
        name = session.get_inputs()[0].name
        reads = []
        for image in self.images:
            steps = self.logits(session.run(None, {name: image})[0]).argmax(-1)
            reads.append("".join(self.charset[i] for i in ctc_greedy(steps) if i < len(self.charset)).strip())
        return reads

    def __call__(self, session: ort.InferenceSession) -> float:
        reads = self.read(session)
        return float(np.mean([char_accuracy(t.lower(), r.lower()) for t, r in zip(self.truths, reads)]))


def _lines(alphabet: Sequence[str], count: int, seed: int, height: int, width: int) -> tuple[list[str], list[np.ndarray]]:
    texts = random_strings(alphabet, count, (4, 7), seed)
    return texts, render_lines(texts, height, width, seed)


def ddddocr(n_eval: int = 64, n_calibration: int = 8, seed: int = 0) -> Workload:
    """ddddocr 1.6.1's recognizer ``common.onnx`` (``beta=True``) on lowercase letters and digits.

    Its input is ``1 x 1 x 64 x W`` grey in [0, 1]; its output, declared ``[1, seqlen]``, is in
    fact ``steps x 1 x 8210`` scores over ``CHARSET_BETA``. Lowercase only, and case-blind
    scoring: the captcha model reads letters of either case in either case.
    """
    charset = load_module_file("ddddocr", "charsets.py", "ddddocr_charsets").CHARSET_BETA
    alphabet = [c for c in string.ascii_lowercase + string.digits if c in charset and c not in LOOKALIKES]

    def prepare(image: np.ndarray) -> np.ndarray:
        return (image.astype(np.float32) / 255.0)[None, None]

    _, calib = _lines(alphabet, n_calibration, seed, DDDDOCR_HEIGHT, DDDDOCR_WIDTH)
    truths, images = _lines(alphabet, n_eval, seed + EVAL_SEED_OFFSET, DDDDOCR_HEIGHT, DDDDOCR_WIDTH)
    return Workload(
        name="ddddocr",
        source="ddddocr 1.6.1, common.onnx (opset 12, the recognizer of DdddOcr(beta=True))",
        model=shipped_file("ddddocr", "common.onnx"),
        calibration=[{"input1": prepare(image)} for image in calib],
        eval_fn=TextScore([prepare(image) for image in images], truths, charset, lambda out: out[:, 0, :]),
        score=f"character accuracy (case-blind) on {n_eval} rendered lines of 4-7 lowercase letters and digits",
    )


def ppocr_charset(model_path: str) -> list[str]:
    """PP-OCRv4's classes: the blank, the dictionary stored in the model's metadata, a space."""
    model = onnx.load(model_path, load_external_data=False)
    meta = {prop.key: prop.value for prop in model.metadata_props}
    return ["<blank>", *meta["character"].splitlines(), " "]


def ppocr(n_eval: int = 64, n_calibration: int = 8, seed: int = 0) -> Workload:
    """RapidOCR 1.4.4's PP-OCRv4 recognizer (51 Conv/MatMul layers) on letters and digits.

    Its input is ``N x 3 x 48 x W`` with ``(x / 255 - 0.5) / 0.5``, at RapidOCR's width of 320;
    its output is ``N x steps x 6625`` probabilities.
    """
    path = shipped_file("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx")
    charset = ppocr_charset(str(path))
    alphabet = [c for c in string.ascii_letters + string.digits if c in charset and c not in LOOKALIKES]

    def prepare(image: np.ndarray) -> np.ndarray:
        grey = (image.astype(np.float32) / 255.0 - 0.5) / 0.5
        return np.repeat(grey[None, None], 3, axis=1)

    _, calib = _lines(alphabet, n_calibration, seed, PPOCR_HEIGHT, PPOCR_WIDTH)
    truths, images = _lines(alphabet, n_eval, seed + EVAL_SEED_OFFSET, PPOCR_HEIGHT, PPOCR_WIDTH)
    return Workload(
        name="ppocr",
        source="rapidocr-onnxruntime 1.4.4, models/ch_PP-OCRv4_rec_infer.onnx (opset 12, dynamic batch and width)",
        model=path,
        calibration=[{"x": prepare(image)} for image in calib],
        eval_fn=TextScore([prepare(image) for image in images], truths, charset, lambda out: out[0]),
        score=f"character accuracy (case-blind) on {n_eval} rendered lines of 4-7 letters and digits",
    )
