"""Preallocated KV caches whose layers share one buffer, so that a commit is one gather per cache.

A `KVCache` holds every layer's keys and values in a single tensor
[layers, 2, batch, kv heads, capacity, head dim]; each layer is a transformers cache layer whose
keys and values are views of it.  A forward writes its k new entries at `slots` (a device tensor) in
every layer and attends over the first `span` entries, with a mask as wide as the span that hides what
is not committed.  Both are set by the caller before the forward: eagerly the span is exact (the
committed length plus the forward's rows), so attention costs what a growing cache's does; under CUDA
graphs it is a bucket that the graph's key names, so one graph serves every length inside it.
`length` is the caller's bookkeeping of the committed entries (transformers reads it as the number of
entries seen, which sizes its own causal mask where the caller passes none: the prefill); the cycle sets it
to a bound on the committed length before each phase (exact eagerly; under graphs, where the true length
lives on the device, an upper bound), and nothing inside a phase reads it.  A forward whose
slots nobody set appends after `length` and moves it on (a model called directly, as tests and the lab do).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from .errors import UsageError


class SharedLayer(DynamicLayer):
    """One layer of a KVCache: writes its new entries at the cache's slots and attends to its span."""

    def __init__(self, owner: "KVCache", index: int):
        super().__init__()
        self.owner, self.index = owner, index

    def lazy_initialization(self, key_states, value_states):
        self.owner.allocate(key_states, value_states)
        self.key_buffer, self.value_buffer = self.owner.buffer[self.index].unbind(0)  # views, made once
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        # One index_copy_ a tensor at slots made once a forward, and a narrow() view: few launches a layer.
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        owner = self.owner
        if owner.slots is None and self.index == 0:  # a forward nobody placed appends (direct model calls)
            owner.appending = key_states.shape[-2]
            owner.append(owner.appending, key_states.device)
        self.key_buffer.index_copy_(2, owner.slots, key_states)
        self.value_buffer.index_copy_(2, owner.slots, value_states)
        self.keys, self.values = self.key_buffer.narrow(2, 0, owner.span), self.value_buffer.narrow(2, 0, owner.span)
        if owner.appending and self.index == len(owner.layers) - 1:
            owner.slots, owner.length, owner.appending = None, owner.length + owner.appending, 0
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.owner.length

    def get_max_length(self) -> int:
        return self.owner.capacity


class KVCache(Cache):
    """All layers' keys and values in one preallocated buffer: allocated when the cache is made where its maker
    knows the entries' shape (`for_attention`), else on the first write."""

    def __init__(self, layers: int, capacity: int):
        self.capacity, self.length, self.buffer = capacity, 0, None
        # where the next forward writes and how many entries it reads; None: it appends after `length`
        self.slots, self.span, self.appending = None, 0, 0
        super().__init__(layers=[SharedLayer(self, i) for i in range(layers)])

    @classmethod
    def for_attention(cls, layers: int, capacity: int, attention: torch.nn.Module) -> "KVCache":
        """A cache for `layers` stock attention modules like `attention` (its config's key/value heads, its
        head_dim, its k_proj's dtype and device; batch 1), its buffer allocated now.  A phase of the cycle may write
        a cache first (the head's, where a one-token prompt leaves it no pair to read before the first cycle):
        allocated on that write, inside a CUDA graph's warm-up, the buffer would belong to the warm-up's side
        stream while the default stream uses it, a use the caching allocator does not see when it frees it."""
        cache = cls(layers, capacity)
        cache.buffer = attention.k_proj.weight.new_zeros(layers, 2, 1, attention.config.num_key_value_heads,
                                                         capacity, attention.head_dim)
        return cache

    def allocate(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if key_states.shape[-1] != value_states.shape[-1]:
            raise UsageError(f"keys of size {key_states.shape[-1]} and values of size {value_states.shape[-1]} a "
                             f"head: this cache keeps both in one buffer and needs them the same size")
        batch, heads, _, head_dim = key_states.shape
        shape = (len(self.layers), 2, batch, heads, self.capacity, head_dim)
        if self.buffer is None:
            self.buffer = key_states.new_zeros(shape)
        elif self.buffer.shape != shape or self.buffer.dtype != key_states.dtype:
            raise RuntimeError(f"a KV cache of shape {tuple(self.buffer.shape)} and {self.buffer.dtype} is written "
                               f"the entries of one of shape {shape} and {key_states.dtype}")

    def append(self, count: int, device) -> None:
        """The next forward writes `count` entries after the committed ones and reads all of them (eager)."""
        if self.length + count > self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded")
        self.slots = torch.arange(self.length, self.length + count, device=device)
        self.span = self.length + count

    def truncate(self, length: int) -> None:
        """Keep the first `length` entries."""
        self.length = length
