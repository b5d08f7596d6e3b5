#!/usr/bin/env bash
# Builds a wheel of this checkout, installs it into a fresh environment outside the checkout, and runs the
# command from another folder: the package must find its trees (tree_configs/ of the checkout, shipped inside the
# package), questions, training prompts and head inside itself.
# The fresh environment takes its dependencies (torch, transformers, ...) from .venv through a .pth line instead
# of installing them again, which takes minutes; eagle_mdsd itself comes from the wheel alone.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="$repo/.venv/bin/python"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH

# from a copy of the tracked files: a build/ folder left in the checkout can hold modules since removed
mkdir "$work/src" "$work/elsewhere"
(cd "$repo" && git ls-files -z | xargs -0 cp --parents -t "$work/src")
"$python" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" "$work/src"
"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --no-deps --disable-pip-version-check "$work"/dist/*.whl
# after the wheel, so that pip does not see the checkout's editable install among the borrowed packages
purelib() { "$1" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"; }
purelib "$python" > "$(purelib "$work/venv/bin/python")/borrowed-dependencies.pth"

cd "$work/elsewhere"
"$work/venv/bin/python" - "$work/venv" "$work/src" <<'PY'
import sys
from pathlib import Path

import eagle_mdsd
from eagle_mdsd import tree
from eagle_mdsd.training import prompts

venv, checkout = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
where = Path(eagle_mdsd.__file__).resolve()
assert where.is_relative_to(venv), f"eagle_mdsd imported from {where}, not the wheel"
assert tree.SHIPPED_TREES.resolve().is_relative_to(venv), f"trees read from {tree.SHIPPED_TREES}, not the wheel"
for path in sorted((checkout / "tree_configs").glob("*.json")):  # every tree of tree_configs/, by name
    assert tree.named(path.stem).read_bytes() == path.read_bytes(), f"the wheel lacks tree {path.stem}"
    tree.load(path.stem)
# every data file and shipped head (the questions, train-head's prompts), byte for byte, read where the code does
assert prompts.DEFAULT_PROMPTS.resolve().is_relative_to(venv), f"prompts read from {prompts.DEFAULT_PROMPTS}"
for folder in ("data", "heads"):
    for path in sorted(p for p in (checkout / "eagle_mdsd" / folder).rglob("*") if p.is_file()):
        shipped = where.parent / path.relative_to(checkout / "eagle_mdsd")
        assert shipped.is_file() and shipped.read_bytes() == path.read_bytes(), f"the wheel lacks {shipped.name}"
PY
quietly() {  # the command's output only where it fails
  "$@" > "$work/log" 2>&1 || { cat "$work/log"; echo "wheel check: \`$*\` failed" >&2; exit 1; }
}
bin="$work/venv/bin"
quietly "$bin/eagle-mdsd" pairs
quietly "$bin/eagle-mdsd" generate --max-new-tokens 8 --prompt hi
echo "wheel check: $(basename "$work"/dist/*.whl) installed outside the checkout ships every tree, data file and" \
     "head, and answers pairs and generate"
