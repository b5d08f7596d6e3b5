"""The benchmarks users run: every method on MT-Bench (`run`), and sweeps over trees, pairs and temperatures
(`sweep`).

The two orchestrators call the parts below them, and the parts never call back up:

- `plans`: what a run runs (`BenchmarkPlan`, `SweepPlan`) and its checks, before any model loads;
- `selection`: which questions, and the untimed warm-up question outside them;
- `records`: the run folder, its settings.json (the command that made it, how its answers are made, the machine
  that timed them), resume;
- `runners`: what answers for each method, and the warm-up to steady state;
- `answering`: the answer files, checked and filled question by question or cell by cell;
- `pages`: the pages, rendered from a run's result.
"""
