"""Sequoia (Chen et al. 2024): the best static tree for a measured positional acceptance vector.

With deterministic top-k children and the topk verifier, the child of rank i
(0-based) is accepted with probability a_i = E[p(i-th most probable draft
token)], whatever its siblings.  Assuming these probabilities are the same at
every node, a tree's expected tokens per cycle is

    E(T) = 1 + sum over draft nodes v of prod over the edges to v of a_rank,

and the best tree with n nodes (root included) and depth at most d is

    f(1, d) = 1,   f(n, d) = 1 + max over child sizes n_0 + n_1 + ... = n - 1
                                 of sum_i a_i f(n_i, d - 1),

a knapsack over the child ranks (children fill ranks 0, 1, ... in order).
The hardware-aware mode weighs E(T) against the time of a cycle measured on
this machine: target forward of n tokens + d head steps + verification.
"""

from __future__ import annotations

import functools
import json
import random
import time
from pathlib import Path

import torch

from . import engine, kernels, models, outputs, tree as trees
from .errors import UsageError

OUT_DIR = Path("runs") / "sequoia"  # where trees are written by default: under runs/, as every command's output

NEG = float("-inf")


def measuring_tree(width: int, depth: int) -> trees.Tree:
    """Along the rank-0 chain every node has `width` children: each cycle visits up to `depth` such nodes."""
    paths = [[0] * (d - 1) + [rank] for d in range(1, depth + 1) for rank in range(width)]
    return trees.compile_tree(paths, f"measure_{width}x{depth}")


def best_trees(acceptance: list[float], max_nodes: int, max_depth: int):
    """value[n, d] = f(n, d) for 1 <= n <= max_nodes, 1 <= d <= max_depth (levels, root included),
    and paths(n, d): the paths of such a best tree."""
    ranks = len(acceptance)

    @functools.lru_cache(maxsize=None)
    def f(n: int, d: int) -> float:
        """Best E of a tree with exactly n nodes on at most d levels (the root's level included)."""
        if n == 1:
            return 1.0
        return NEG if d == 1 else 1.0 + g(0, n - 1, d - 1)

    @functools.lru_cache(maxsize=None)
    def g(rank: int, m: int, d: int) -> float:
        """Best sum_i a_i f(n_i, d) over children of ranks >= rank with m nodes in all."""
        if m == 0:
            return 0.0
        if rank == ranks:
            return NEG
        return max(acceptance[rank] * f(size, d) + g(rank + 1, m - size, d) for size in range(1, m + 1))

    def paths(n: int, d: int, prefix: tuple[int, ...] = ()) -> list[list[int]]:
        out, m, rank, depth_left = [], n - 1, 0, d - 1
        while m > 0 and depth_left > 0:
            best = max(range(1, m + 1),
                       key=lambda size: acceptance[rank] * f(size, depth_left) + g(rank + 1, m - size, depth_left))
            child = prefix + (rank,)
            out.append(list(child))
            out += paths(best, depth_left, child)
            m, rank = m - best, rank + 1
        return out

    value = {(n, d): f(n, d) for n in range(1, max_nodes + 1) for d in range(1, max_depth + 1)}
    return value, paths


def measure_acceptance(decoder: engine.Decoder, prompts: list[list[int]], max_new_tokens: int,
                       temperature: float, seed: int = 0) -> tuple[list[float], int]:
    """a_i from the decoder's walks (its tree must be a measuring tree): (vector, nodes visited)."""
    width = max(len(kids) for kids in decoder.tree.children)
    accepted, visits = [0] * width, 0
    for index, prompt in enumerate(prompts):
        result = decoder.generate(prompt, max_new_tokens, temperature, seed + index)
        for rank in result.accepted_ranks:
            visits += 1
            if rank >= 0:
                accepted[rank] += 1
    return [count / max(visits, 1) for count in accepted], visits


def time_cycle_parts(decoder: engine.Decoder, prompt: list[int], sizes=(1, 2, 4, 8, 16, 32, 64),
                     repeats: int = 5) -> dict:
    """Median seconds of a target forward over n tree tokens after `prompt`, and of one head draft step, on the
    kernels the decoder's calls run."""
    device = decoder.device
    call, prompt = decoder.start(prompt, max(sizes), 1.0)
    length, dtype = len(prompt), decoder.target.dtype
    timings = {"target_s": {}, "head_step_s": 0.0}
    with torch.inference_mode(), kernels.packed(decoder.packed):
        call.target_cache.append(length, device)
        features = decoder.target_forward(call.target_cache, prompt, torch.arange(length, device=device))
        call.target_cache.truncate(length)
        for n in sizes:
            tokens = prompt[-1:].repeat(n)
            visible = torch.zeros(n, length + n, dtype=dtype, device=device)
            samples = []
            for _ in range(repeats + 1):
                start = time.perf_counter()
                call.target_cache.append(n, device)
                decoder.target_forward(call.target_cache, tokens, torch.full((n,), length, device=device), visible)
                samples.append(time.perf_counter() - start)
            timings["target_s"][n] = sorted(samples[1:])[repeats // 2]
        rows = min(8, length)  # a draft level's rows
        visible = torch.zeros(rows, rows, dtype=dtype, device=device)
        samples = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            outputs = decoder.draft_model.run(call.head_cache, features[-rows:], prompt[-rows:],
                                              torch.arange(rows, device=device), visible)
            decoder.draft_model.distribution(outputs, 1.0)
            samples.append(time.perf_counter() - start)
            call.head_cache.truncate(0)
        timings["head_step_s"] = sorted(samples[1:])[repeats // 2]
    return timings


def _target_seconds(timings: dict, n: int) -> float:
    """Linear interpolation of the measured target forward times."""
    points = sorted((int(k), v) for k, v in timings["target_s"].items())
    for (n0, t0), (n1, t1) in zip(points, points[1:]):
        if n <= n1:
            return t0 + (t1 - t0) * (n - n0) / (n1 - n0)
    (n0, t0), (n1, t1) = points[-2], points[-1]
    return t1 + (t1 - t0) * (n - n1) / (n1 - n0)


def verification_rest(profile, timings: dict, nodes: int) -> float:
    """Seconds a cycle's verify phase spends beside the target's forward over its tree (the walk, the commit):
    the profiled phase, less the forward over the root and `nodes` that `choose` counts by the tree's size."""
    measured = profile.profile.get("verify", 0.0) / max(profile.cycles, 1)
    return max(measured - _target_seconds(timings, nodes + 1), 0.0)


def choose(acceptance: list[float], max_nodes: int, max_depth: int, timings: dict | None = None,
           verify_s: float = 0.0) -> dict:
    """The best (nodes, depth): by expected tokens per cycle, or per second with `timings`."""
    value, paths = best_trees(acceptance, max_nodes + 1, max_depth + 1)
    best = None
    for (n, d), expected in value.items():
        if timings is None:
            score, seconds = expected, None
        else:  # one target forward over the tree, a head step per internal depth, the walk
            seconds = _target_seconds(timings, n) + (d - 1) * timings["head_step_s"] + verify_s
            score = expected / seconds
        if best is None or score > best["score"] + 1e-12:
            best = {"nodes": n - 1, "depth": d - 1, "expected_tokens": expected, "score": score,
                    "cycle_s": seconds}
    if not best["nodes"]:  # a tree of the root alone is refused by every command that loads a tree
        raise UsageError(f"the acceptance measured by rank ({', '.join(f'{a:.3f}' for a in acceptance)}) makes the "
                         f"best tree the root alone, with no draft: measure on more --prompts or --max-new-tokens, "
                         f"with a head trained for this model, or a larger --draft-vocab")
    best["paths"] = paths(best["nodes"] + 1, best["depth"] + 1)
    return best


def held_out_prompts(tokenizer, count: int, seed: int = 0) -> list[list[int]]:
    """Training-pool prompts from the far end of the shuffled pool (the data stage starts at the front)."""
    from . import training

    pool = training.load_prompts([training.DEFAULT_PROMPTS])
    random.Random(seed).shuffle(pool)
    return [models.chat_prompt_ids(tokenizer, p["prompt"]) for p in pool[max(len(pool) - count, 0) :]]  # (-0: all)


def build(decoder_for, tokenizer, out: Path, max_nodes: int, max_depth: int, hardware_aware: bool,
          temperature: float = 0.0, prompts: int = 8, max_new_tokens: int = 96, width: int = 8) -> dict:
    """Measure a_i (and timings), pick the tree, write it to `out` (from output_path) with how it was made;
    returns what was written."""
    measuring = decoder_for(measuring_tree(width, min(max_depth, 4)))
    chosen_prompts = held_out_prompts(tokenizer, prompts)
    acceptance, visits = measure_acceptance(measuring, chosen_prompts, max_new_tokens, temperature)
    timings = verify_s = None
    if hardware_aware:
        timings = time_cycle_parts(measuring, chosen_prompts[0])
        profile = measuring.generate(chosen_prompts[0], max_new_tokens, temperature, profile=True)
        verify_s = verification_rest(profile, timings, measuring.tree.size)
    best = choose(acceptance, max_nodes, max_depth, timings, verify_s or 0.0)
    record = {"paths": best["paths"],
              "description": f"Sequoia tree: {best['nodes']} nodes, depth {best['depth']}, expected "
                             f"{best['expected_tokens']:.3f} tokens per cycle"
                             + (f", {best['expected_tokens'] / best['cycle_s']:.1f} tokens/s predicted"
                                if hardware_aware else ""),
              "acceptance": acceptance, "visits": visits, "temperature": temperature,
              "max_nodes": max_nodes, "max_depth": max_depth, "hardware_aware": hardware_aware,
              "timings": timings, "verify_s": verify_s}
    outputs.write_atomically(out, json.dumps(record, indent=1) + "\n")
    return record


def output_path(name: str, out_dir: Path = OUT_DIR) -> Path:
    """out_dir/NAME.json (default runs/sequoia/; `--tree` takes its path); NAME must be a plain file name and no
    shipped tree's, and an existing tree there one that Sequoia wrote (a rerun may replace it, a hand-written
    topology is kept)."""
    if not name or name.startswith(".") or Path(name).name != name or "\\" in name:
        raise UsageError(f"--name {name!r} must be a plain file name such as my_tree (written to "
                         f"{Path(out_dir) / 'NAME.json'})")
    if (trees.SHIPPED_TREES / f"{name}.json").exists():
        raise UsageError(f"--name {name} is the name of a shipped tree, which `--tree {name}` names: pick "
                         f"another --name")
    out = Path(out_dir) / f"{name}.json"
    if out.exists():
        try:
            written_by_sequoia = "hardware_aware" in json.loads(out.read_text())
        except (json.JSONDecodeError, TypeError, UnicodeDecodeError, OSError):
            written_by_sequoia = False
        if not written_by_sequoia:
            raise UsageError(f"{out} is a tree Sequoia did not write: pick another --name")
    return out
