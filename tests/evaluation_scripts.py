"""Import a script of evaluation/, lab/ or scripts/ (not packages) as a module, for the tests of the scripts and
pilots."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = (ROOT / "evaluation", ROOT / "lab", ROOT / "scripts")


def load(name: str):
    """evaluation/NAME.py, lab/NAME.py or scripts/NAME.py as a module; their siblings are importable (the pilots reuse
    lab/harness.py)."""
    for folder in FOLDERS:
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    path = next((folder / f"{name}.py" for folder in FOLDERS if (folder / f"{name}.py").exists()), None)
    if path is None:
        raise FileNotFoundError(f"no {name}.py in evaluation/, lab/ or scripts/")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
