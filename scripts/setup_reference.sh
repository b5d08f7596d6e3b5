#!/usr/bin/env bash
# Creates .venv-ref with EAGLE's reference code (the PyPI package eagle-llm
# 1.2.1) for evaluation/reference_eagle.py. It needs transformers 4.x, so it
# lives apart from .venv; its own declared dependencies (gradio, wandb, ...)
# are not needed to decode and are left out. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv-ref/bin/python ] || python3 -m venv .venv-ref
if ! .venv-ref/bin/python -c "import torch, transformers, eagle.model.ea_model" 2>/dev/null; then
  .venv-ref/bin/python -m pip install -q "torch==2.13.0" "transformers==4.40.2"
  .venv-ref/bin/python -m pip install -q --no-deps "eagle-llm==1.2.1"
fi
