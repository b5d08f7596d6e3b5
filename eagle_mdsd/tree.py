"""Static draft-tree topologies: validation, loading and the shipped tree files (the engine's buffers are
cycle.py's TreeBuffers).

A topology is a list of paths; path [0, 1] is the second child of the first
child of the root.  The root is the token already sampled from the target.
Compiled once: nodes sorted by (depth, path), node 0 the root.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from . import drafting
from .errors import MissingFile, UsageError, read_text

# The shipped trees: a wheel holds them inside the package (pyproject.toml maps the checkout's top-level
# tree_configs/ to eagle_mdsd/tree_configs); a checkout reads its tree_configs/ where it is.
_PACKAGE = Path(__file__).resolve().parent
SHIPPED_TREES = next((folder for folder in (_PACKAGE / "tree_configs", _PACKAGE.parent / "tree_configs")
                      if folder.is_dir()), _PACKAGE / "tree_configs")
USER_TREES = Path("tree_configs")  # under the working directory: a tree put there is reached by its name
MAX_NODES = 1024


@dataclass(frozen=True)
class Tree:
    name: str
    paths: tuple[tuple[int, ...], ...]  # node i > 0 has path paths[i - 1]
    parent: tuple[int, ...]             # parent[0] = -1
    depth: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]  # child node ids in sibling order
    ancestors: torch.Tensor             # [N+1, N+1] bool: row sees column (ancestor or self)

    @property
    def size(self) -> int:
        """Number of draft nodes (the root excluded)."""
        return len(self.paths)

    @property
    def max_depth(self) -> int:
        return max(self.depth)

    def level(self, d: int) -> list[int]:
        return [i for i, depth in enumerate(self.depth) if depth == d]

    def internal(self, d: int) -> list[int]:
        """Nodes at depth d that have children: the ones the head must run on."""
        return [i for i in self.level(d) if self.children[i]]

    # The topology interface that static, dynamic (dynamic.py) and grafted (lookup.py) trees share.
    @property
    def label(self) -> str:
        return self.name

    @property
    def fill(self) -> int:
        """The most children one node draws."""
        return max(max(map(len, self.children)), 1)

    static = True  # its nodes are fixed before drafting
    grafted = 0  # prompt-lookup tokens grafted on

    def check_scheme(self, scheme, vocab: int = 1 << 30) -> None:
        """One-line error unless every internal node's child count is a draft count the scheme can produce."""
        scheme = drafting.get(scheme)
        for kids in self.children:
            if kids:
                try:
                    scheme.check(len(kids), vocab)
                except ValueError as error:
                    raise UsageError(f"drafter {scheme.name!r} cannot fill tree {self.name!r} "
                                     f"(a node has {len(kids)} children): {error}") from None


def compile_tree(paths, name: str = "custom") -> Tree:
    """Validate a list of paths and build the tree; every problem is a one-line ValueError."""
    if not isinstance(paths, (list, tuple)) or not paths:
        raise UsageError(f"tree {name!r}: expected a non-empty list of paths such as [[0], [1], [0, 0]]")
    if len(paths) > MAX_NODES:
        raise UsageError(f"tree {name!r} has {len(paths)} nodes: at most {MAX_NODES} are supported")
    clean = []
    for path in paths:
        if (not isinstance(path, (list, tuple)) or not path
                or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in path)):
            raise UsageError(f"tree {name!r}: path {json.dumps(path)} must be a non-empty list of non-negative "
                             f"integers")
        clean.append(tuple(path))
    known = set(clean)
    if len(known) != len(clean):
        duplicate = next(p for p in clean if clean.count(p) > 1)
        raise UsageError(f"tree {name!r}: path {list(duplicate)} appears twice")
    for path in clean:
        if len(path) > 1 and path[:-1] not in known:
            raise UsageError(f"tree {name!r}: path {list(path)} has no parent {list(path[:-1])}: add it")
        if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in known:
            raise UsageError(f"tree {name!r}: path {list(path)} has no earlier sibling "
                             f"{list(path[:-1] + (path[-1] - 1,))}: sibling indices must be 0..k-1")
    ordered = sorted(clean, key=lambda p: (len(p), p))
    index = {(): 0} | {p: i + 1 for i, p in enumerate(ordered)}
    parent = [-1] + [index[p[:-1]] for p in ordered]
    depth = [0] + [len(p) for p in ordered]
    children = [[] for _ in index]
    for p in ordered:
        children[index[p[:-1]]].append(index[p])
    ancestors = torch.eye(len(index), dtype=torch.bool)
    for node in range(1, len(index)):
        ancestors[node] |= ancestors[parent[node]]
    return Tree(name, tuple(ordered), tuple(parent), tuple(depth), tuple(tuple(c) for c in children), ancestors)


def chain(length: int) -> Tree:
    return compile_tree([[0] * d for d in range(1, length + 1)], f"chain{length}")


def names() -> list[str]:
    """The trees reached by name: the shipped ones and those in tree_configs/ under the working directory."""
    return sorted({p.stem for folder in (SHIPPED_TREES, USER_TREES) for p in folder.glob("*.json")})


def named(name: str) -> Path | None:
    """The file of the tree called `name`: a shipped one or tree_configs/NAME.json under the working directory;
    None where neither is (and for a name with a folder in it, which is no name).  A name means one tree: a
    tree_configs/NAME.json that differs from the shipped tree NAME is a one-line error (give its path instead)."""
    if not name or Path(name).name != name:
        return None
    shipped, own = SHIPPED_TREES / f"{name}.json", USER_TREES / f"{name}.json"
    if shipped.is_file() and own.is_file() and own.read_bytes() != shipped.read_bytes():
        raise UsageError(f"tree {name!r}: {own} differs from the shipped tree of that name, and a name means one "
                         f"tree: rename the file, or give its path (--tree ./{own})")
    if own.is_file() and not shipped.is_file() and re.fullmatch(r"chain[1-9][0-9]*", name):
        refuse_built_in_name(name, "chainN")
    return next((path for path in (shipped, own) if path.is_file()), None)


def refuse_built_in_name(name: str, kind: str) -> None:
    """A tree_configs/NAME.json under the working directory whose name is a built-in tree's is a one-line error:
    a name means one tree, and reading the file under it would label its results with the built-in tree's name."""
    own = USER_TREES / f"{name}.json"
    raise UsageError(f"tree {name!r}: {own} takes the name of a built-in tree ({kind}), and a name means one tree: "
                     f"rename the file, or give its path (--tree ./{own})")


UNKNOWN = "unknown tree"  # how a name no tree has begins its error (tree_specs adds the dynamic trees)


def load(spec: str) -> Tree:
    """A tree by name (shipped, or tree_configs/NAME.json under the working directory), `chainN`, or a path to
    a JSON file.

    The file holds either a list of paths or {"paths": [...], "description": ...}.
    """
    path, name = Path(spec), spec  # a file's tree is named by its path as given: a name means one tree
    if path.suffix != ".json":
        path = named(spec)
        if path is None and re.fullmatch(r"chain[1-9][0-9]*", spec):
            if int(spec[5:]) > MAX_NODES:  # before its paths are made: chain99999999 would fill the memory
                raise UsageError(f"tree {spec}: at most {MAX_NODES} nodes are supported")
            return chain(int(spec[5:]))
        if path is None:
            raise UsageError(f"{UNKNOWN} {spec!r}: use one of {', '.join(names())}, chainN, or a .json file")
    elif not path.exists():
        raise MissingFile(f"tree file {spec} does not exist")
    try:
        data = json.loads(read_text(path, "tree file"))
    except json.JSONDecodeError as error:
        raise UsageError(f"tree file {spec} is not valid JSON: {error.msg} at line {error.lineno}") from None
    except RecursionError:
        raise UsageError(f"tree file {spec} nests its lists too deeply to be a tree: give a list of paths") from None
    paths = data.get("paths") if isinstance(data, dict) else data
    return compile_tree(paths, name)


def file_record(topology) -> dict:
    """What an answer row records of a tree beside its label: {"tree_file": a digest of its paths} where they come
    from a user's file (a path, or tree_configs/NAME.json under the working directory), which may be edited between
    two runs under one label; nothing for a built-in tree (shipped, chainN, dynamic)."""
    tree = getattr(topology, "base", topology)
    if not isinstance(tree, Tree) or (SHIPPED_TREES / f"{tree.name}.json").is_file() or re.fullmatch(
            r"chain[1-9][0-9]*", tree.name):
        return {}
    return {"tree_file": hashlib.sha256(json.dumps(tree.paths).encode()).hexdigest()[:16]}


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool [q, kv] -> float [q, kv], 0 where visible and the dtype's minimum elsewhere: the form eager and SDPA
    attention take as it is."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)
