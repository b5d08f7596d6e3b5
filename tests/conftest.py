"""Under pytest-xdist (the default suite runs on two workers, `-n 2` in pyproject.toml) each worker takes one
core, and so do the processes its tests start (the GPU script's stages, a benchmark killed part-way): torch's own
threads would otherwise oversubscribe the machine."""

import os


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"  # inherited by subprocesses
