"""Benchmark on real pretrained models that PyPI wheels ship, used as they ship.

Each workload (:mod:`benchmarks.real_models.workloads`) pairs a model file from a wheel with an
evaluation this package builds: rendered text lines for the OCR recognizers
(:mod:`~benchmarks.real_models.text`), drawn faces for MTCNN (:mod:`~benchmarks.real_models.faces`)
and synthesized speech for Silero VAD (:mod:`~benchmarks.real_models.speech`).
:mod:`~benchmarks.real_models.baselines` measures the recipes that need no tuning, and
:mod:`~benchmarks.real_models.run` runs the studies and prints the tables.

Example:
    python -m benchmarks.real_models.run --model ddddocr --seeds 5 --trials 40 \\
        --out benchmarks/results/real_ddddocr.json
"""
