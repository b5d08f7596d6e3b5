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
