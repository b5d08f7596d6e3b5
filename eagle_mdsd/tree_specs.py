"""A tree by its spec, as --tree and --trees take it: a static tree (a name, chainN or a .json file: tree.load), a
dynamic one ('eagle2', 'opt_tree', with options as in 'eagle2:total_tokens=16,depth=5,top_k=4'), and any of them
+ 'lookup' or 'lookupN' (prompt-lookup drafts grafted on: lookup.py)."""

from __future__ import annotations

import re

from . import dynamic, lookup
from . import tree as static_trees
from .errors import UsageError

# Each tree's shape by device.  On a GPU, EAGLE-2's released defaults (total_token 60, depth 5 after the first
# level, top_k 10) and OPT-Tree's budget: a forward over 60 tokens costs about what one over a token does.  On a
# CPU it grows with the tokens, and the shapes are those its cost model predicts fastest
# (evaluation/dynamic_defaults.py; its page is cited in docs/design.md).
DEFAULTS = {"cuda": {"eagle2": {"total_tokens": 60, "depth": 6, "top_k": 10},
                     "opt_tree": {"nodes": 40, "threshold": 0.1, "max_depth": 10, "top_k": 8}},
            "cpu": {"eagle2": {"total_tokens": 12, "depth": 3, "top_k": 4},
                    "opt_tree": {"nodes": 8, "threshold": 0.4, "max_depth": 10, "top_k": 4}}}


def device_kind(device) -> str:
    """'cpu' for a CPU, else 'cuda' (a GPU, or 'auto': layers spread over the GPUs)."""
    return "cpu" if str(device).startswith("cpu") else "cuda"


def _flags(options) -> str:
    """The CLI flags of options: ['total_tokens', 'top_k'] -> '--total-tokens, --top-k'."""
    return ", ".join("--" + option.replace("_", "-") for option in options)


def load(spec: str, device="cpu", **overrides):
    """A static tree (tree.load) or a dynamic one: 'eagle2', 'opt_tree', or with options such as
    'eagle2:total_tokens=16,depth=5,top_k=4', unset options taking their DEFAULTS on `device`; `overrides`
    (CLI flags, None = unset) apply first.  Any of them + 'lookup' or 'lookupN': prompt-lookup drafts grafted on
    at temperature 0 (lookup.py)."""
    base, tokens = split(spec)
    if tokens is not None:
        if split(base)[1] is not None:  # a graft fills the slots reserved after the drafted tree: one a tree
            raise UsageError(f"tree {spec!r}: one {lookup.SUFFIX} suffix a tree, e.g. "
                             f"{split(base)[0]}{lookup.SUFFIX}{tokens}")
        return lookup.LookupTree(load(base, device, **overrides), tokens)
    name, _, options = spec.partition(":")
    given = {key: value for key, value in overrides.items() if value is not None}
    if name not in dynamic.NAMES:
        if given:
            raise UsageError(f"{_flags(given)} shape dynamic trees ({', '.join(dynamic.NAMES)}), not tree "
                             f"{spec!r}: drop {'it' if len(given) == 1 else 'them'} or pick a dynamic tree")
        try:
            return static_trees.load(spec)
        except UsageError as error:
            if not str(error).startswith(static_trees.UNKNOWN):
                raise
            raise UsageError(f"{str(error).removesuffix(', or a .json file')}, a .json file, a dynamic tree "
                             f"({', '.join(dynamic.NAMES)}), or any of them{lookup.SUFFIX}") from None
    if (static_trees.USER_TREES / f"{name}.json").is_file():
        static_trees.refuse_built_in_name(name, "a dynamic tree")
    values = dict(DEFAULTS[device_kind(device)][name])
    unused = [key for key in given if key not in values]
    if unused:
        raise UsageError(f"{name} does not take {_flags(unused)} (it takes {_flags(values)}): drop "
                         f"{'it' if len(unused) == 1 else 'them'}")
    values.update(given)
    seen = set()
    for item in filter(None, options.split(",")):
        key, _, raw = item.partition("=")
        if key not in values:
            raise UsageError(f"tree {spec!r}: unknown option {key!r}; {name} takes {', '.join(values)}")
        if key in seen:  # (the last one won, unsaid)
            raise UsageError(f"tree {spec!r}: option {key} given twice: give it once")
        seen.add(key)
        try:
            values[key] = type(values[key])(raw)
        except ValueError:
            raise UsageError(f"tree {spec!r}: {key} must be a number, got {raw!r}") from None
    if name == "eagle2":
        if values["total_tokens"] < 2:
            raise UsageError(f"eagle2: --total-tokens (total_tokens) counts the root and its drafts, so it must be "
                             f"at least 2, got {values['total_tokens']}")
        return check_growth(spec, dynamic.make(name, values["total_tokens"] - 1, values["depth"], values["top_k"]))
    return check_growth(spec, dynamic.make(name, values["nodes"], values["max_depth"], values["top_k"],
                                           values["threshold"]))


def check_growth(spec: str, tree: dynamic.DynamicTree) -> dynamic.DynamicTree:
    """`tree`, or a one-line error when its growth exceeds what a tree may hold (static_trees.MAX_NODES).

    A cycle adds top_k x depth head expansions to the head's cache (DynamicTree.size) and grows
    top_k + (depth - 1) x top_k^2 candidates, each expanded one with a q row over the vocabulary: top_k=20000
    would ask for gigabytes before the first draft.  Bounding the expansions as a tree's nodes are keeps every
    such buffer small, and refuses the spec here, before the decoder allocates any of them."""
    depth = "depth" if tree.name == "eagle2" else "max_depth"
    if tree.top_k * tree.max_depth > static_trees.MAX_NODES:
        raise UsageError(f"tree {spec!r}: top_k (--top-k) {tree.top_k} x {depth} ({_flags([depth])}) "
                         f"{tree.max_depth} = {tree.top_k * tree.max_depth} head expansions a cycle, and at most "
                         f"{static_trees.MAX_NODES} are supported (a tree's most nodes): lower top_k or {depth}")
    return tree


def split(spec: str) -> tuple[str, int | None]:
    """'eagle_default+lookup7' -> ('eagle_default', 7); no suffix -> (spec, None)."""
    base, found, count = spec.rpartition(lookup.SUFFIX)
    if not found:
        return spec, None
    tokens = int(count) if re.fullmatch(r"[1-9][0-9]*", count) else lookup.DEFAULT_TOKENS if not count else 0
    if not base or tokens < 1:
        raise UsageError(f"tree {spec!r}: write TREE{lookup.SUFFIX} or TREE{lookup.SUFFIX}N with N >= 1 lookup "
                         f"tokens, e.g. eagle_default{lookup.SUFFIX}10")
    if tokens > static_trees.MAX_NODES:  # each token is a node the target scores, as a static tree's are
        raise UsageError(f"tree {spec!r}: at most {static_trees.MAX_NODES} lookup tokens are supported, got {tokens}")
    return base, tokens
