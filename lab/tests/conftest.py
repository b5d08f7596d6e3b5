"""The lab's tests run only when asked for: `pytest -m lab` (the default suite skips them)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for folder in (ROOT / "tests", ROOT / "lab"):  # the tests' helpers (tiny, evaluation_scripts) and the pilots
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.lab)
