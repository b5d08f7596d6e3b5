"""Under pytest-xdist (the default suite runs on two workers, `-n 2` in pyproject.toml) each worker takes one
core: torch's own threads would otherwise oversubscribe the machine."""

import os


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
