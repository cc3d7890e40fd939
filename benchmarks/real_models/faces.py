"""facenet-pytorch's MTCNN networks, through optuna-quant's torch path, on drawn faces.

facenet-pytorch 2.6.0 imports torchvision in its ``__init__`` and in the detection helpers of
``models/mtcnn.py``, and torchvision's wheels do not import beside this project's torch. The three
networks need only torch, so :func:`mtcnn_network` compiles the ``PNet``, ``RNet`` and ``ONet``
class definitions out of the shipped ``mtcnn.py`` (nothing else of that file runs), and they load
the weights the wheel ships in ``data/*.pt`` themselves, as they do in the package.

The evaluation draws face-like crops (a skin-toned oval with eyes, brows, nose and mouth, on a
random background) and non-faces (random shapes and noise), and scores how well the quantized
network agrees with fp32: a crop counts when the face decision at MTCNN's threshold agrees and,
for a face, the regressed box is within 0.02 of the crop size of fp32's.

Example:
    >>> net = mtcnn_network("ONet")                           # doctest: +SKIP
    >>> net(torch.zeros(1, 3, 48, 48))[-1].shape              # doctest: +SKIP
    torch.Size([1, 2])
"""

from __future__ import annotations

import ast
import os
from typing import Any

import numpy as np
import onnxruntime as ort
from PIL import Image
from PIL import ImageDraw

from benchmarks.real_models.base import session
from benchmarks.real_models.base import Workload
from benchmarks.real_models.wheels import shipped_file


NETWORKS = {"RNet": 24, "ONet": 48}  # input size; PNet, fully convolutional on a pyramid, has 4 tiny convs
THRESHOLD = 0.7  # facenet-pytorch's default thresholds for RNet and ONet
BOX_TOLERANCE = 0.02
SKIN = ((241, 194, 125), (224, 172, 105), (198, 134, 66), (141, 85, 36), (255, 219, 172), (233, 190, 160))


def mtcnn_network(name: str) -> Any:
    """facenet-pytorch's ``PNet``, ``RNet`` or ``ONet`` in eval mode, with the shipped weights."""
    import torch
    from torch import nn

    path = shipped_file("facenet_pytorch", "models/mtcnn.py")
    tree = ast.parse(path.read_text(), filename=str(path))
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name in ("PNet", "RNet", "ONet")]
    namespace: dict[str, Any] = {"torch": torch, "nn": nn, "np": np, "os": os, "__file__": str(path)}
    exec(compile(ast.Module(body=classes, type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name](pretrained=True).eval()


def _background(rng: np.random.Generator, size: int) -> Image.Image:
    base = rng.uniform(0, 255, size=3)
    gradient = np.linspace(-1, 1, size)[:, None, None] * rng.uniform(-60, 60, size=3)
    noise = rng.normal(0, rng.uniform(2, 25), size=(size, size, 3))
    pixels = np.clip(base + gradient + noise, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def draw_face(rng: np.random.Generator, size: int) -> Image.Image:
    """A frontal face-like drawing that fills most of a ``size`` x ``size`` crop."""
    image = _background(rng, size)
    draw = ImageDraw.Draw(image)
    skin = tuple(int(c) for c in np.clip(np.array(SKIN[rng.integers(len(SKIN))]) + rng.normal(0, 10, 3), 0, 255))
    w, h = size * rng.uniform(0.55, 0.8), size * rng.uniform(0.7, 0.95)
    cx, cy = size / 2 + rng.uniform(-0.06, 0.06) * size, size / 2 + rng.uniform(-0.06, 0.06) * size
    hair = tuple(int(c) for c in rng.uniform(10, 90, 3))
    draw.ellipse((cx - w / 2 - 2, cy - h / 2 - 4, cx + w / 2 + 2, cy), fill=hair)
    draw.ellipse((cx - w / 2, cy - h / 2 + h * 0.08, cx + w / 2, cy + h / 2), fill=skin)
    eye_y, eye_dx, eye_r = cy - h * 0.08, w * 0.2, w * 0.08
    for side in (-1, 1):
        ex = cx + side * eye_dx
        draw.ellipse((ex - eye_r * 1.4, eye_y - eye_r, ex + eye_r * 1.4, eye_y + eye_r), fill=(245, 245, 245))
        draw.ellipse((ex - eye_r * 0.7, eye_y - eye_r * 0.7, ex + eye_r * 0.7, eye_y + eye_r * 0.7), fill=(30, 20, 10))
        draw.line((ex - eye_r * 1.6, eye_y - eye_r * 2.2, ex + eye_r * 1.6, eye_y - eye_r * 2.4), fill=hair, width=max(1, size // 24))
    shade = tuple(int(c * 0.8) for c in skin)
    draw.polygon([(cx, eye_y + h * 0.02), (cx - w * 0.07, cy + h * 0.16), (cx + w * 0.07, cy + h * 0.16)], fill=shade)
    mouth_y = cy + h * 0.28
    draw.ellipse((cx - w * 0.18, mouth_y - h * 0.04, cx + w * 0.18, mouth_y + h * 0.04), fill=(150, 40, 50))
    return image


def draw_non_face(rng: np.random.Generator, size: int) -> Image.Image:
    """Random ellipses, boxes and lines on a random background."""
    image = _background(rng, size)
    draw = ImageDraw.Draw(image)
    for _ in range(rng.integers(1, 6)):
        x0, y0 = rng.uniform(-0.2, 0.8, 2) * size
        x1, y1 = x0 + rng.uniform(0.1, 0.8) * size, y0 + rng.uniform(0.1, 0.8) * size
        colour = tuple(int(c) for c in rng.uniform(0, 255, 3))
        shape = rng.integers(3)
        if shape == 0:
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        elif shape == 1:
            draw.rectangle((x0, y0, x1, y1), fill=colour)
        else:
            draw.line((x0, y0, x1, y1), fill=colour, width=int(rng.integers(1, max(2, size // 6))))
    return image


def crops(count: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` crops, half faces, as MTCNN's normalized ``N x 3 x size x size`` input, and labels."""
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % 2 == 0
    images = []
    for is_face in labels:
        drawn = draw_face(rng, 2 * size) if is_face else draw_non_face(rng, 2 * size)
        images.append(np.asarray(drawn.resize((size, size), Image.BILINEAR), dtype=np.float32))
    batch = (np.stack(images).transpose(0, 3, 1, 2) - 127.5) * 0.0078125
    return batch.astype(np.float32), labels


def _heads(session: ort.InferenceSession, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Face probability and box offsets: the outputs whose last dimension is 2 and 4."""
    outputs = session.run(None, {session.get_inputs()[0].name: batch})
    by_width = {out.shape[-1]: out for out in outputs}
    return by_width[2][:, 1], by_width[4]


class FaceAgreement:
    """``eval_fn``: the share of crops on which a network agrees with its fp32 version.

    Args:
        batch: The crops, as the network's input.
        fp32: A session of the fp32 network.
    """

    def __init__(self, batch: np.ndarray, fp32: ort.InferenceSession) -> None:
        self.batch = batch
        self.probability, self.boxes = _heads(fp32, batch)

    def __call__(self, session: ort.InferenceSession) -> float:
        probability, boxes = _heads(session, self.batch)
        face = self.probability > THRESHOLD
        same = (probability > THRESHOLD) == face
        close = np.abs(boxes - self.boxes).max(axis=1) <= BOX_TOLERANCE
        return float(np.mean(same & (close | ~face)))


def mtcnn(network: str = "ONet", n_eval: int = 256, n_calibration: int = 32, seed: int = 0) -> Workload:
    """A workload of one MTCNN network (``"RNet"`` or ``"ONet"``) through the torch path."""
    import torch

    from optuna_quant.quantization.torch_export import export_module

    size = NETWORKS[network]
    module, example = mtcnn_network(network), torch.zeros(1, 3, size, size)
    exported, _ = export_module(module, example)  # the fp32 model optuna-quant compares against
    batch, labels = crops(n_eval, size, seed + 1000)
    agreement = FaceAgreement(batch, session(exported))
    called_face = agreement.probability > THRESHOLD
    return Workload(
        name=f"mtcnn_{network.lower()}",
        source=f"facenet-pytorch 2.6.0, {network} (models/mtcnn.py) with data/{network.lower()}.pt",
        model=module,
        calibration=list(crops(n_calibration, size, seed)[0][:, None]),
        eval_fn=agreement,
        score=f"agreement with fp32 on {n_eval} drawn crops (half faces): face decision at {THRESHOLD}, "
        f"box offsets within {BOX_TOLERANCE}",
        example_inputs=example,
        info={
            "fp32_accuracy_vs_drawn_labels": float(np.mean(called_face == labels)),
            "fp32_faces_called": int(called_face.sum()),
        },
        exported=exported,
    )
