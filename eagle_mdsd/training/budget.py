"""--max-minutes: a stage stops between steps (a batch of prompts, a data shard) so that it ends within the budget.

Checking the clock only before a step lets the last step run past the budget by up to a whole step, which on a
CPU is minutes; so a step starts only when one as long as the longest so far still fits.  The first step always
runs (a budget shorter than one step would otherwise never get anything done), and the budget counts from the
stage's call, model loading included.
"""

from __future__ import annotations

import time


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
