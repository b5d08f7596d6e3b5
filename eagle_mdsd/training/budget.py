"""What a stage may use: time (--max-minutes) and memory (--batch-size).

--max-minutes: a stage stops between steps (a batch of prompts, a data shard) so that it ends within the budget.

Checking the clock only before a step lets the last step run past the budget by up to a whole step, which on a
CPU is minutes; so a step starts only when one as long as the longest so far still fits.  The first step always
runs (a budget shorter than one step would otherwise never get anything done), and the budget counts from the
stage's call, model loading included.

--batch-size: a batch whose KV cache alone cannot fit in the memory free on the target's device is refused before
it starts.  The cache is a lower bound on what generating needs, so a batch that fits is never refused, and one
that cannot fit would otherwise exhaust the machine's memory.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..errors import UsageError


class Budget:
    """The time a stage may still take: `allows_step` before each step, `step_took` after it."""

    def __init__(self, max_minutes: float | None):
        self.deadline = time.monotonic() + 60 * max_minutes if max_minutes else None
        self.longest_step = 0.0
        self.step_started = None

    def allows_step(self) -> bool:
        """Whether a step as long as the longest so far ends within the budget; starts its clock if so."""
        now = time.monotonic()
        if self.deadline is not None and now + self.longest_step > self.deadline:
            return False
        self.step_started = now
        return True

    def step_took(self) -> None:
        self.longest_step = max(self.longest_step, time.monotonic() - self.step_started)


def free_memory(device: torch.device) -> int | None:
    """Bytes free on the device: CUDA's free memory and what torch holds there unused, or on a CPU the kernel's
    MemAvailable (Linux); None elsewhere."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - \
            torch.cuda.memory_allocated(device)
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) * 1024 for line in lines if line.startswith("MemAvailable:")), None)


def cache_bytes_per_token(target) -> int | None:
    """Bytes a token adds to the KV cache (every layer's keys and values in the target's dtype), for the models
    where the config says it: every layer attends in full and the config names its key/value heads.  None for
    others (sliding windows and hybrid layers keep less; other names for the heads), which are not checked."""
    config = target.config.get_text_config()
    if getattr(config, "sliding_window", None) or any(kind != "full_attention" for kind in
                                                      getattr(config, "layer_types", None) or ()):
        return None
    kv_heads = getattr(config, "num_key_value_heads", None)
    if kv_heads is None:
        return None
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * target.dtype.itemsize


def check_batch_memory(target, batch_size: int, tokens: int, batch: int | None = None) -> None:
    """One-line error unless a batch of `batch` sequences (--batch-size `batch_size` where None) of `tokens` fits:
    its KV cache against the memory free on the target's device.  A model spread over devices, or one whose
    cache the config does not size, is not checked."""
    batch = batch_size if batch is None else batch
    per_token = cache_bytes_per_token(target)
    spread = len(set(getattr(target, "hf_device_map", {}).values())) > 1
    free = None if per_token is None or spread else free_memory(target.device)
    if free is None or batch * tokens * per_token <= free:
        return
    per_sequence = tokens * per_token
    fits = free // per_sequence
    fix = f"use --batch-size {fits} or less" if fits else "lower --max-new-tokens"
    raise UsageError(f"--batch-size {batch_size}: a batch of {batch} sequences of up to {tokens} tokens needs "
                     f"{_size(batch * per_sequence)} for its KV cache alone, more than the {_size(free)} free on "
                     f"{target.device}: {fix}")


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**28 else f"{count / 2**20:.2f} MiB"
