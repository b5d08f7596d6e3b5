"""Import a script of evaluation/ (not a package) as a module, for the tests of the pilots and comparisons."""

import importlib.util
import sys
from pathlib import Path

EVALUATION = Path(__file__).resolve().parent.parent / "evaluation"


def load(name: str):
    """evaluation/NAME.py as a module; its siblings are importable (the pilots reuse fused_features_pilot.py)."""
    if str(EVALUATION) not in sys.path:
        sys.path.insert(0, str(EVALUATION))
    spec = importlib.util.spec_from_file_location(name, EVALUATION / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
