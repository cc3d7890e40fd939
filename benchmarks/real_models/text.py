"""Rendered text lines and their scoring, for the OCR recognizers.

Strings are drawn from the recognizer's own charset, rendered in black on white with the TrueType
fonts the machine has (Debian's fonts-dejavu and fonts-liberation), and scored by character
accuracy, ``1 - edit distance / length``, after CTC greedy decoding.

Example:
    >>> lines = render_lines(["ab12"], height=32, width=96, seed=0)
    >>> lines[0].shape
    (32, 96)
    >>> char_accuracy("abcd", "abed")
    0.75
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image
from PIL import ImageDraw
from PIL import ImageFont


FONT_DIRS = (Path("/usr/share/fonts/truetype/dejavu"), Path("/usr/share/fonts/truetype/liberation"))
# Upright regular faces only: the recognizers read print, not italics.
FONT_NAMES = (
    "DejaVuSans.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansCondensed.ttf",
    "LiberationSans-Regular.ttf",
    "LiberationSerif-Regular.ttf",
    "LiberationMono-Regular.ttf",
)


def fonts() -> list[Path]:
    """The fonts of :data:`FONT_NAMES` that this machine has.

    Raises:
        FileNotFoundError: If it has none (Debian: ``apt-get install fonts-dejavu-core``).
    """
    found = [folder / name for name in FONT_NAMES for folder in FONT_DIRS if (folder / name).is_file()]
    if not found:
        raise FileNotFoundError(
            f"None of the fonts {FONT_NAMES} is in {[str(d) for d in FONT_DIRS]}: "
            "install Debian's fonts-dejavu-core and fonts-liberation."
        )
    return found


def random_strings(alphabet: Sequence[str], count: int, length: tuple[int, int], seed: int) -> list[str]:
    """``count`` strings of ``length[0]`` to ``length[1]`` characters drawn from ``alphabet``."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(length[0], length[1] + 1, size=count)
    return ["".join(rng.choice(list(alphabet), size=int(n))) for n in sizes]


def render_lines(texts: Sequence[str], height: int, width: int, seed: int) -> list[np.ndarray]:
    """Each text as a ``height x width`` uint8 grey image, left-aligned, in a font taken in turn.

    The glyphs fill about 60 % of the height, and a line too long for ``width`` is scaled down
    to fit, as a recognizer's own preprocessing would.
    """
    rng = np.random.default_rng(seed)
    faces = fonts()
    images = []
    for i, text in enumerate(texts):
        font = ImageFont.truetype(str(faces[i % len(faces)]), size=int(height * rng.uniform(0.55, 0.7)))
        left, top, right, bottom = font.getbbox(text)
        margin = height // 8
        line = Image.new("L", (right - left + 2 * margin, height), 255)
        ImageDraw.Draw(line).text((margin - left, (height - (bottom - top)) // 2 - top), text, font=font, fill=0)
        if line.width > width:
            line = line.resize((width, height), Image.BILINEAR)
        canvas = Image.new("L", (width, height), 255)
        canvas.paste(line, (0, 0))
        images.append(np.asarray(canvas))
    return images


def ctc_greedy(indices: np.ndarray) -> list[int]:
    """Collapse repeats and drop the blank (index 0) from a per-step argmax.

    Example:
        >>> ctc_greedy(np.array([0, 3, 3, 0, 3, 5, 5]))
        [3, 3, 5]
    """
    keep = np.ones(len(indices), dtype=bool)
    keep[1:] = indices[1:] != indices[:-1]
    return [int(i) for i in indices[keep] if i != 0]


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance between ``a`` and ``b``."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ca != cb))
    return row[-1]


def char_accuracy(truth: str, read: str) -> float:
    """``1 - edit_distance / len(truth)``, floored at 0."""
    return max(0.0, 1.0 - edit_distance(truth, read) / max(len(truth), 1))
