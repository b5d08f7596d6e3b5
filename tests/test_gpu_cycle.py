"""evaluation/gpu_cycle.py, the GPU step's cycle timing, runs on a CPU at toy scale (DEVICE=cpu)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_cycle_timing_writes_its_page_on_a_cpu(tmp_path):
    done = subprocess.run([sys.executable, "evaluation/gpu_cycle.py", "--shape", "tiny", "--device", "cpu",
                           "--tokens", "6", "--repeats", "1", "--prompt", "16", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    page = (tmp_path / "gpu_cycle.md").read_text()
    for row in ("| ours, plain step, CUDA graphs off |", "| ours, eagle_default cycle, CUDA graphs off |",
                "| transformers `generate`, step |"):
        assert row in page
    assert "An eagle_default cycle over our plain step: **" in page and "no GPU (device cpu)" in page


def test_the_cycle_timing_refuses_cuda_without_a_gpu(tmp_path):
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = subprocess.run([sys.executable, "evaluation/gpu_cycle.py", "--device", "cuda", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1].startswith("error: --device cuda but")
