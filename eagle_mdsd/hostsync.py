"""Counting what makes a decoding loop wait on its device: host syncs and launched ops.

On a GPU every device-to-host transfer (`.item()`, `int()`, `bool()`, `float()`, `.tolist()`,
`nonzero`, a tensor used as an index) waits until the launch queue has run dry, and every top-level
aten op is a launch issued from Python.  Both are properties of the code, not of the device, so they
can be counted on a CPU: `syncs()` wraps the tensor methods that transfer, `top_level_ops()` runs
torch's profiler and keeps the aten ops that no other aten op called.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

import torch

# Tensor methods that bring a value back to the host (int(), bool(), float(), and indexing a Python
# sequence with a tensor go through the dunders).
TRANSFERS = ("item", "tolist", "nonzero", "numpy", "__bool__", "__int__", "__float__", "__index__")


# Tensors made from host data: on CUDA a copy from pageable memory, which waits for the stream too.  Counted
# apart (key "to_device"), since the transfers above are what the issue of a busy GPU counts first.
UPLOADS = ("tensor", "as_tensor")


@contextmanager
def syncs():
    """Count host transfers inside the block: yields a Counter {method: calls}.  `transfers(counter)` is the
    number of device-to-host transfers, counter["to_device"] the tensors made from host data.  Calls made
    from inside another counted call (item() behind int(), say) count once."""
    counts: Counter = Counter()
    originals = {name: getattr(torch.Tensor, name) for name in TRANSFERS}
    uploads = {name: getattr(torch, name) for name in UPLOADS}
    original_nonzero = torch.nonzero
    depth = [0]

    def counted(name, function):
        def wrapper(*args, **kwargs):
            if depth[0] == 0:
                counts[name] += 1
            depth[0] += 1
            try:
                return function(*args, **kwargs)
            finally:
                depth[0] -= 1
        return wrapper

    def upload(function):
        def wrapper(data, *args, **kwargs):
            if depth[0] == 0 and not isinstance(data, torch.Tensor):
                counts["to_device"] += 1
            return function(data, *args, **kwargs)
        return wrapper

    for name, function in originals.items():
        setattr(torch.Tensor, name, counted(name, function))
    for name, function in uploads.items():
        setattr(torch, name, upload(function))
    torch.nonzero = counted("nonzero", original_nonzero)
    try:
        yield counts
    finally:
        for name, function in originals.items():
            setattr(torch.Tensor, name, function)
        for name, function in uploads.items():
            setattr(torch, name, function)
        torch.nonzero = original_nonzero


def transfers(counts: Counter) -> int:
    """Device-to-host transfers in a Counter from `syncs()`."""
    return sum(calls for name, calls in counts.items() if name != "to_device")


# Aten ops that launch no kernel: views, metadata and allocations without a fill.
NO_LAUNCH = frozenset("aten::" + name for name in (
    "view", "_unsafe_view", "reshape", "_reshape_alias", "slice", "select", "unsqueeze", "squeeze", "expand",
    "as_strided", "t", "transpose", "permute", "narrow", "alias", "detach", "lift_fresh", "resolve_conj",
    "resolve_neg", "empty", "empty_like", "empty_strided", "split", "split_with_sizes", "unbind", "chunk"))


@contextmanager
def top_level_ops():
    """Count the top-level aten ops inside the block (each one a kernel launch on a GPU): yields a two-item
    list filled when the block ends with [ops issued one by one, graph replays].  Ops inside an emulated graph
    replay (graphs.Emulated) belong to the replay, one launch, and are not counted as ops; nor are the NO_LAUNCH
    ops.  The profiler's raw events are nested here by their intervals on each thread, as its own event tree
    nests them (that tree costs some 30x the decoding it profiles to build)."""
    from torch.profiler import ProfilerActivity, profile

    from .graphs import REPLAY

    result = [0, 0]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield result
    threads: dict = {}
    for event in prof.profiler.kineto_results.events():
        if event.device_type() == torch.autograd.DeviceType.CPU:
            start, thread = event.start_ns(), event.start_thread_id()
            threads.setdefault(thread, []).append((start, -(start + event.duration_ns()), event.name()))
    for events in threads.values():
        stack = []  # (end, name, inside a replay) of the events enclosing the current one
        for start, negative_end, name in sorted(events):
            while stack and stack[-1][0] <= start:
                stack.pop()
            parent, replayed = (stack[-1][1], stack[-1][2]) if stack else (None, False)
            if name == REPLAY and not replayed:
                result[1] += 1
            elif (name.startswith("aten::") and name not in NO_LAUNCH and not replayed
                  and (parent is None or not parent.startswith("aten::"))):
                result[0] += 1
            stack.append((-negative_end, name, replayed or name == REPLAY))


def per_cycle(call, tokens: int) -> dict:
    """What one cycle issues: call(n) generates n new tokens and returns its cycles; a call of `tokens` less a
    call of 1 (the prefill alone), over its cycles.  Returns transfers, uploads, ops (issued one by one) and
    replays (graphs) per cycle."""
    with syncs() as prefill:
        call(1)
    with syncs() as full:
        cycles = call(tokens)
    with top_level_ops() as prefill_ops:
        call(1)
    with top_level_ops() as full_ops:
        call(tokens)
    return {"cycles": cycles,
            "transfers": (transfers(full) - transfers(prefill)) / cycles,
            "uploads": (full["to_device"] - prefill["to_device"]) / cycles,
            "ops": (full_ops[0] - prefill_ops[0]) / cycles,
            "replays": (full_ops[1] - prefill_ops[1]) / cycles}
