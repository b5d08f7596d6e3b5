"""Preallocated KV caches whose layers share one buffer, so that a commit is one gather per cache.

A `KVCache` holds every layer's keys and values in a single tensor
[layers, 2, batch, kv heads, capacity, head dim]; each layer is a transformers cache layer whose
keys and values are views of it.  A forward writes its k new entries at `length .. length + k` in
every layer and the last layer's write moves the length past them.  After a tree is verified the
decoder moves the accepted entries next to the root with `gather` (one index_select and one copy over
all layers at once, instead of two per layer) and drops the rest with `truncate`.

A static cache (for CUDA graphs, graphs.py) keeps every call's shapes fixed: a forward's entries are
written at `slots`, a device tensor, and attention runs over the whole capacity with a mask that hides
what is not committed (`mask`); its length is the decoder's bookkeeping alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache, DynamicLayer

from .errors import UsageError


class SharedLayer(DynamicLayer):
    """One layer of a KVCache: writes its new entries at the cache's length and attends to all before them."""

    def __init__(self, owner: "KVCache", index: int):
        super().__init__()
        self.owner, self.index = owner, index

    def lazy_initialization(self, key_states, value_states):
        self.owner.allocate(key_states, value_states)
        self.key_buffer, self.value_buffer = self.owner.buffer[self.index].unbind(0)  # views, made once
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        # One index_copy_ a tensor at slots made once a forward (by the first layer), and a narrow() view: fewer
        # launches a layer than writing through slices.
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        owner = self.owner
        if not owner.static and self.index == 0:
            end = owner.length + key_states.shape[-2]
            if end > owner.capacity:
                raise RuntimeError(f"KV cache capacity {owner.capacity} exceeded")
            owner.slots = torch.arange(owner.length, end, device=key_states.device)
        self.key_buffer.index_copy_(2, owner.slots, key_states)
        self.value_buffer.index_copy_(2, owner.slots, value_states)
        if owner.static:
            self.keys, self.values = self.key_buffer, self.value_buffer
            return self.keys, self.values
        end = owner.length + key_states.shape[-2]
        self.keys, self.values = self.key_buffer.narrow(2, 0, end), self.value_buffer.narrow(2, 0, end)
        if self.index == len(self.owner.layers) - 1:
            self.owner.length = end
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.owner.length

    def get_max_length(self) -> int:
        return self.owner.capacity


class KVCache(Cache):
    """All layers' keys and values in one preallocated buffer (allocated on the first write)."""

    def __init__(self, layers: int, capacity: int, static: bool = False):
        self.capacity, self.length, self.buffer = capacity, 0, None
        self.static, self.slots = static, None  # where a forward writes: set by the decoder when static, else by layer 0
        super().__init__(layers=[SharedLayer(self, i) for i in range(layers)])

    def allocate(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if key_states.shape[-1] != value_states.shape[-1]:
            raise UsageError(f"keys of size {key_states.shape[-1]} and values of size {value_states.shape[-1]} a "
                             f"head: this cache keeps both in one buffer and needs them the same size")
        if self.buffer is None:
            batch, heads, _, head_dim = key_states.shape
            self.buffer = key_states.new_zeros(len(self.layers), 2, batch, heads, self.capacity, head_dim)

    def mask(self, block: torch.Tensor, prefix: int) -> torch.Tensor:
        """The additive mask of a forward whose rows see the first `prefix` entries and, after them, what
        `block` [rows, width] says: as wide as the entries so far, or the whole capacity when static."""
        if not self.static:
            return F.pad(block, (prefix, 0))
        mask = block.new_full((block.shape[0], self.capacity), torch.finfo(block.dtype).min)
        mask[:, :prefix] = 0
        mask[:, prefix : prefix + block.shape[1]] = block
        return mask

    def next_slots(self, count: int, device) -> torch.Tensor:
        """Where a forward of `count` rows writes: the positions after the length."""
        return torch.arange(self.length, self.length + count, device=device)

    def gather(self, start: int, slots: torch.Tensor) -> None:
        """Copy the entries at `slots` (a device tensor) to start, start + 1, ...; the length is left to
        `truncate`, so slots past the accepted ones (padding) may be anything inside the buffer."""
        if self.buffer is not None and len(slots):
            self.buffer[..., start : start + len(slots), :] = self.buffer.index_select(-2, slots)

    def truncate(self, length: int) -> None:
        """Keep the first `length` entries."""
        self.length = length
