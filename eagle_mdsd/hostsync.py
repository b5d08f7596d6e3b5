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


@contextmanager
def top_level_ops():
    """Count the top-level aten ops inside the block (each one a kernel launch on a GPU): yields a
    one-item list filled with the count when the block ends."""
    from torch.profiler import ProfilerActivity, profile

    result = [0]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield result
    result[0] = sum(1 for event in prof.events()
                    if event.name.startswith("aten::")
                    and (event.cpu_parent is None or not event.cpu_parent.name.startswith("aten::")))
