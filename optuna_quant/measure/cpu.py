"""The int8 class of this machine's CPU: which int8 instructions onnxruntime's kernels can use.

A study's latency figures, its sensitivity and the accuracy of its int8 models hold only for the
class they were measured on: without dot-product instructions onnxruntime's u8s8 kernels run
slower and saturate 16-bit sums (another ``acc_loss``), so trials of two classes never mix in one
study (:mod:`optuna_quant.trial.records`).

Example:
    >>> support = int8_support()
    >>> support.int8_class in INT8_CLASSES
    True
"""

from __future__ import annotations

from dataclasses import dataclass
import importlib
from pathlib import Path

import onnxruntime as ort


CPU_INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni", "avx512bw", "avx2", "i8mm", "asimddp")
"""The /proc/cpuinfo flags that matter to onnxruntime's int8 kernels, fastest first."""
DOT_PRODUCT_FLAGS = frozenset({"amx_int8", "avx512_vnni", "avx_vnni", "asimddp", "i8mm"})
"""Flags of int8 dot-product instructions: without one, int8 kernels gain little over fp32."""
_CLASS_OF_FLAG = {
    "amx_int8": "x86-amx",
    "avx512_vnni": "x86-vnni",
    "avx_vnni": "x86-vnni",
    "avx512bw": "x86-avx512",
    "avx2": "x86-avx2",
    "i8mm": "arm-i8mm",
    "asimddp": "arm-dotprod",
}
INT8_CLASSES = (*dict.fromkeys(_CLASS_OF_FLAG.values()), "other")
"""The classes, fastest first within each architecture; ``other`` has none of the flags."""
# numpy reads CPUID itself: a flag that the kernel lists but CPUID does not report (a user-mode
# emulator such as qemu-x86_64 shows the host's /proc/cpuinfo) is not there for onnxruntime either.
# numpy reads no AMX or AVX-VNNI bit: those two stand on a feature that every CPU with them has
# (Sapphire Rapids' AVX-512 set; GFNI, on Alder Lake, Sapphire Rapids and Zen 5 onwards) and the
# older CPUs an emulator offers lack, so an emulated Haswell on an AMX host reads x86-avx2.
_NUMPY_FEATURE = {
    "amx_int8": "AVX512_SPR",
    "avx512_vnni": "AVX512VNNI",
    "avx_vnni": "GFNI",
    "avx512bw": "AVX512BW",
    "avx2": "AVX2",
    "asimddp": "ASIMDDP",
}


@dataclass(frozen=True)
class Int8Support:
    """What this machine's onnxruntime offers for int8.

    Attributes:
        onnxruntime_version: ``onnxruntime.__version__``.
        providers: The execution providers of this onnxruntime build.
        instruction_sets: The flags of :data:`CPU_INT8_FLAGS` that this CPU has.
        cpu_model: The CPU's model name as the kernel reports it (x86), else ``unknown``.
    """

    onnxruntime_version: str
    providers: tuple[str, ...]
    instruction_sets: tuple[str, ...]
    cpu_model: str = "unknown"

    @property
    def dot_product(self) -> bool:
        """Whether the CPU has int8 dot-product instructions (VNNI, AMX, ARM dot product)."""
        return bool(DOT_PRODUCT_FLAGS.intersection(self.instruction_sets))

    @property
    def int8_class(self) -> str:
        """The CPU's int8 class (:data:`INT8_CLASSES`), named by its fastest int8 instructions."""
        return next((_CLASS_OF_FLAG[flag] for flag in self.instruction_sets), "other")

    def describe(self) -> str:
        """One line: the onnxruntime version, providers, int8 instructions and class."""
        found = ", ".join(self.instruction_sets) or "none of " + ", ".join(CPU_INT8_FLAGS)
        return (
            f"onnxruntime {self.onnxruntime_version} ({', '.join(self.providers)}); "
            f"int8 instructions: {found} (class {self.int8_class})"
        )


def int8_support(cpuinfo: str | Path | None = None) -> Int8Support:
    """Read the int8 instruction sets from ``cpuinfo`` and onnxruntime's providers.

    Args:
        cpuinfo: A ``/proc/cpuinfo`` file to read; ``None`` reads this machine's, and drops a flag
            that numpy's own CPUID reading knows and does not find. A missing file (not Linux)
            gives no instruction sets.

    Example:
        >>> support = int8_support()
        >>> "CPUExecutionProvider" in support.providers
        True
    """
    try:
        text = Path(cpuinfo or "/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    flags: set[str] = set()
    model = "unknown"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86, ARM
            flags.update(value.split())
        elif key.strip() == "model name":
            model = value.strip()
    if cpuinfo is None:
        flags = confirmed_by_cpuid(flags, _numpy_cpu_features())
    return Int8Support(
        onnxruntime_version=ort.__version__,
        providers=tuple(ort.get_available_providers()),
        instruction_sets=tuple(flag for flag in CPU_INT8_FLAGS if flag in flags),
        cpu_model=model,
    )


def confirmed_by_cpuid(flags: set[str], cpuid: dict[str, bool]) -> set[str]:
    """The ``flags`` of /proc/cpuinfo that numpy's CPUID reading (``cpuid``) does not contradict.

    Example:
        >>> sorted(confirmed_by_cpuid({"amx_int8", "avx512_vnni", "avx2"}, {"AVX512_SPR": False, "AVX2": True}))
        ['avx2', 'avx512_vnni']
    """
    return {flag for flag in flags if cpuid.get(_NUMPY_FEATURE.get(flag, ""), True)}


def _numpy_cpu_features() -> dict[str, bool]:
    # numpy's runtime dispatch table, read from CPUID; its module moved in numpy 2.
    for module in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):
        try:
            return dict(importlib.import_module(module).__cpu_features__)
        except (ImportError, AttributeError):
            continue
    return {}
