#!/usr/bin/env bash
# Builds a wheel of this checkout, installs it into a fresh environment outside the checkout, and runs the
# command from another folder: the package must find its trees (tree_configs/ of the checkout, shipped inside the
# package), questions and head inside itself.
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
"$work/venv/bin/python" - "$work/venv" "$work/src/tree_configs" <<'PY'
import sys
from pathlib import Path

import eagle_mdsd
from eagle_mdsd import tree

venv, checkout_trees = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
where = Path(eagle_mdsd.__file__).resolve()
assert where.is_relative_to(venv), f"eagle_mdsd imported from {where}, not the wheel"
assert tree.SHIPPED_TREES.resolve().is_relative_to(venv), f"trees read from {tree.SHIPPED_TREES}, not the wheel"
for path in sorted(checkout_trees.glob("*.json")):  # every tree of tree_configs/, by name, from the wheel
    assert tree.named(path.stem).read_bytes() == path.read_bytes(), f"the wheel lacks tree {path.stem}"
    tree.load(path.stem)
PY
quietly() {  # the command's output only where it fails
  "$@" > "$work/log" 2>&1 || { cat "$work/log"; echo "wheel check: \`$*\` failed" >&2; exit 1; }
}
bin="$work/venv/bin"
quietly "$bin/eagle-mdsd" pairs
quietly "$bin/eagle-mdsd" generate --max-new-tokens 8 --prompt hi
quietly "$bin/eagle-mdsd" train-head prompts --run run --count 2 --batch-size 8 --max-minutes 2
test "$(wc -l < run/self_prompts.jsonl)" -ge 2
echo "wheel check: $(basename "$work"/dist/*.whl) installed outside the checkout answers pairs, generate and" \
     "train-head prompts"
