"""What a benchmark or sweep runs, checked before any model loads: its plan, the EAGLE setups of its trees and
the sweep's cells."""

from __future__ import annotations

import dataclasses

from .. import lookup, peers, tree_specs, verification
from ..errors import UsageError
from .records import file_safe, temperature_tag

METHODS = ("eagle", "baseline") + peers.METHODS
PEER = "hf_generate"  # the page gives every method's tokens/s over transformers generate's, the usual reference,
PEERS = (PEER, peers.COMPILED)  # and over its compiled static-cache form's, the fast one
# EAGLE's pair at T > 0: sampled drafts beat deterministic top-k ones there (measured: docs/benchmarks.md).
SAMPLING_PAIR = "without_replacement/rrs_wo"
# EAGLE's static tree at T > 0: where every tree row costs target compute, as on a CPU, a chain of two sampled
# drafts outruns a wide tree at T = 1, though its tau is lower (measured: docs/benchmarks.md).  'same' keeps each
# --trees entry.
SAMPLING_TREE = "chain2"


@dataclasses.dataclass(frozen=True)
class BenchmarkPlan:
    """What `run.run_benchmark` runs: `count` questions of `bench_name` spread over its categories (None: all),
    each method at each temperature.  EAGLE drafts with drafter/verifier at T = 0; at T > 0 a static tree without
    its own pair (TREE@D/V) uses `sampling_pair` ('D/V', or 'same' for drafter/verifier) on `sampling_tree` (or
    'same': on itself).  kernels_choice: what EAGLE and baseline run their linear layers on (kernels.CHOICES); the
    transformers peers keep stock kernels.  name: the answer folder and report stem (default
    benchmark_<date>_<dtype>)."""

    bench_name: str = "mt_bench"
    count: int | None = 8
    temperatures: tuple = (0.0, 1.0)
    methods: tuple = METHODS
    trees: tuple = ("eagle_default",)
    drafter: str = "topk"
    verifier: str = "topk"
    sampling_pair: str = SAMPLING_PAIR
    sampling_tree: str = SAMPLING_TREE
    draft_vocab: int | str | None = "auto"
    kernels_choice: str = "auto"
    cuda_graphs: str = "auto"
    dtype: str = "bfloat16"
    device: str = "cpu"
    max_new_tokens: int = 128
    seed: int = 0
    name: str | None = None
    new_run: bool = False  # a fresh run: its folder is made here (or refused) and its pages must not exist

    def __post_init__(self):
        for method in self.methods:
            if method not in METHODS:
                raise UsageError(f"unknown method {method!r}: use one of {', '.join(METHODS)}")
        _distinct_temperatures(self.temperatures)


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """The cells `sweep` runs: every tree x (drafter, verifier) pair (None: all lossless pairs) x temperature that
    fits, on `count` questions of `bench_name` (their first `turns` turns; None: all), EAGLE only.  name: the
    answer folder and page stem (default sweep_<date>_<dtype>)."""

    trees: tuple = ("chain4", "binary_depth4", "quad_depth3", "eagle_default")
    temperatures: tuple = (0.0, 0.1, 0.6, 1.0)
    pairs: tuple | None = None
    bench_name: str = "mt_bench"
    count: int = 8
    turns: int | None = 1
    max_new_tokens: int = 64
    draft_vocab: int | str | None = "auto"
    kernels_choice: str = "auto"
    cuda_graphs: str = "auto"
    dtype: str = "bfloat16"
    device: str = "cpu"
    seed: int = 0
    name: str | None = None
    new_run: bool = False  # a fresh run: its folder is made here (or refused) and its page must not exist

    def __post_init__(self):
        _distinct_temperatures(self.temperatures)


def _distinct_temperatures(temperatures) -> None:
    """One-line error where two temperatures would share an answer file (its name carries 6 significant digits)."""
    tags = [temperature_tag(t) for t in temperatures]
    repeated = sorted({tag for tag in tags if tags.count(tag) > 1})
    if repeated:
        raise UsageError(f"--temperatures gives {', '.join(repeated)} more than once (answer files name a temperature "
                         f"by 6 significant digits): give each temperature once")


def check_fits(topology, drafter: str, verifier: str) -> None:
    """One-line error unless the pair is lossless and can fill the tree (static or dynamic)."""
    verification.check_pair(drafter, verifier)
    topology.check_scheme(drafter)


def tree_label(topology) -> str:
    return topology.label


def tree_and_pair(entry: str, drafter: str, verifier: str) -> tuple[str, str, str]:
    """'TREE' or 'TREE@DRAFTER/VERIFIER' (a pair for this tree only) -> (tree, drafter, verifier)."""
    spec, at, pair = entry.partition("@")
    if not at:
        return spec, drafter, verifier
    own_drafter, slash, own_verifier = pair.partition("/")
    if not slash or not own_drafter or not own_verifier:
        raise UsageError(f"tree {entry!r}: write a tree's own pair as TREE@DRAFTER/VERIFIER, "
                         f"e.g. eagle2@greedy/greedy")
    return spec, own_drafter, own_verifier


def parse_sampling_pair(text: str, drafter: str, verifier: str) -> tuple[str, str]:
    """--sampling-pair 'DRAFTER/VERIFIER' (a lossless pair) or 'same' (drafter/verifier) -> (drafter, verifier)."""
    if text == "same":
        return drafter, verifier
    sampled_drafter, slash, sampled_verifier = text.partition("/")
    if not slash or not sampled_drafter or not sampled_verifier:
        raise UsageError(f"--sampling-pair {text!r}: write DRAFTER/VERIFIER, e.g. {SAMPLING_PAIR}, or 'same'")
    verification.check_pair(sampled_drafter, sampled_verifier)
    return sampled_drafter, sampled_verifier


def benchmark_setups(trees, drafter: str, verifier: str, sampled: tuple[str, str],
                     sampling_tree: str = "same", device: str = "cpu") -> list[dict]:
    """{at T > 0: (label, topology, drafter, verifier)} per --trees entry: a tree's own pair (TREE@D/V) at
    every temperature; otherwise drafter/verifier at T = 0 and, on a static tree, `sampled` at T > 0 - on
    `sampling_tree` instead of the entry's tree unless that is 'same' (so at T > 0 the static entries share one
    run on it, and those with prompt-lookup drafts one on `sampling_tree`+lookupN; a dynamic tree grows its
    children with topk or greedy drafts, so it keeps its tree and drafter/verifier).  A dynamic tree takes
    `device`'s defaults."""
    setups = []
    for entry in trees:
        spec, own_drafter, own_verifier = tree_and_pair(entry, drafter, verifier)
        topology = tree_specs.load(spec, device)
        check_fits(topology, own_drafter, own_verifier)
        own = "" if (own_drafter, own_verifier) == (drafter, verifier) else f"@{own_drafter}/{own_verifier}"
        own_run = (tree_label(topology) + own, topology, own_drafter, own_verifier)
        setup = {False: own_run, True: own_run}
        if not own and topology.static:
            sampled_topology = _sampling_topology(topology, sampling_tree)
            check_fits(sampled_topology, *sampled)
            setup[True] = (tree_label(sampled_topology), sampled_topology, *sampled)
        setups.append(setup)
    _once([setup[False][0] for setup in setups])
    return setups


def _once(labels: list[str]) -> None:
    """One-line error where --trees names one tree twice, or two trees whose answer files' names would be one
    (records.file_safe: sub/c.json and sub_c.json)."""
    safe = [file_safe(label) for label in labels]
    repeated = sorted({label for label, name in zip(labels, safe) if safe.count(name) > 1})
    if repeated:
        raise UsageError(f"--trees names {', '.join(repeated)} more than once, or as trees whose answer files would "
                         f"share a name (a tree file is named by its path): give each tree once, renaming a file "
                         f"if need be")


def _sampling_topology(topology, sampling_tree: str):
    """The tree a static entry samples on at T > 0: `sampling_tree` (with the entry's prompt-lookup graft, if
    any), or the entry's own tree for 'same'."""
    if sampling_tree == "same":
        return topology
    sampled_topology = tree_specs.load(sampling_tree)
    if not sampled_topology.static or sampled_topology.grafted:
        raise UsageError(f"--sampling-tree {sampling_tree}: give a static tree (a name, chainN or a "
                         f"file), or 'same'")
    if topology.grafted:  # TREE+lookupN samples on SAMPLING_TREE+lookupN
        return lookup.LookupTree(sampled_topology, topology.grafted)
    return sampled_topology


def sweep_cells(plan: SweepPlan) -> tuple[dict, list[tuple]]:
    """({label: topology} of the plan's trees, [(temperature, tree label, drafter, verifier)] of every cell that
    fits); a plan with no cell that fits is a one-line error."""
    pairs = plan.pairs or verification.pairs()
    loaded = [tree_specs.load(tree, plan.device) for tree in plan.trees]
    _once([tree_label(topology) for topology in loaded])
    topologies = {tree_label(topology): topology for topology in loaded}
    for drafter, verifier in pairs:
        verification.check_pair(drafter, verifier)
    cells = []
    for t in plan.temperatures:
        for tree_name, topology in topologies.items():
            for drafter, verifier in pairs:
                try:
                    check_fits(topology, drafter, verifier)
                except ValueError:
                    continue  # e.g. spechub needs two children at every node; dynamic trees take topk only
                cells.append((t, tree_name, drafter, verifier))
    if not cells:
        raise UsageError(f"no pair of --pairs fits any tree of --trees ({', '.join(topologies)}): e.g. spechub needs "
                         f"two children at every node, opt_tree topk drafts")
    return topologies, cells
