"""The acceptance-rate study on real text: how far each verifier is from the optimum alpha*.

collect: for each task (MT-Bench, translation, summarization, qa,
math_reasoning; Spec-Bench first turns) the target answers greedily (at most
128 new tokens) until `positions` answer positions are gathered; at each
position it stores the target's logits and the logits of two drafts:
`eagle` (the shipped head, fed the true features and tokens, as at a tree's
first level) and `truncated` (the target's first third of layers, its final
norm and lm_head: a draft that shares nothing trained with the head).
Logits are kept in fp16, one file per task, written atomically (resumable).
Each file records how it was collected (`settings`: positions, token limit,
dtype, head checksum), and a rerun reuses only files collected alike.

analyse: at temperature T both distributions are softmax(logits / T).  Each
position's p and q are truncated to the tokens that carry all but 1e-6 of p,
of q, and of q without its n - 1 most probable tokens (what the later draws
without replacement and greedy drafting's sample see), the rest merged into
one bucket (so every acceptance moves by at most ~(n + 1) 1e-6; a test checks
it against the full vocabulary, q peaked as at a low temperature included).  Per
position: alpha* for with-, without-replacement and greedy drafting (exact,
eagle_mdsd.theory), K-SEQ's closed form, and for rrs_w, rrs_wo, greedy and
spechub (n = 2) the mean over `draws` sampled draft tuples of the exact
accepted mass of the verifier's plan.  A task's value is the mean over its
positions with a 95% normal interval; gaps to alpha* are paired per position.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from pathlib import Path

import torch
from tqdm import tqdm

from . import checkpoint, drafting, head, models, outputs, questions, theory, verification
from .benchmarks import machine
from .drafting import warp
from .tree import additive_mask
from .errors import MissingFile, UsageError

TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning")
DRAFTS = ("eagle", "truncated")
EPSILON = 1e-6
# verifier -> (drafting scheme, the alpha* it is measured against): every verifier declared lossless for one
# sampling scheme (verification.Verifier.schemes), against that scheme's alpha*; topk, which verifies any drafts,
# is for deterministic ones and is not studied
VERIFIERS = {name: (verifier.schemes[0], verifier.schemes[0]) for name, verifier in verification.VERIFIERS.items()
             if len(verifier.schemes) == 1}
ALPHAS = ("with_replacement", "without_replacement", "greedy")


# -- collection ------------------------------------------------------------------------------


def _task_positions(target, draft_head, tokenizer, task: str, positions: int, max_new_tokens: int,
                    layers: int) -> dict:
    from .training import _collate

    p_rows, eagle_rows, truncated_rows, sources = [], [], [], []
    embed, lm_head, norm = target.get_input_embeddings(), target.get_output_embeddings(), target.model.norm
    gathered = 0
    for question in questions.load(task):
        if gathered >= positions:
            break
        ids = models.chat_prompt_ids(tokenizer, question["turns"][0])
        with torch.inference_mode():
            sequence = target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                       max_new_tokens=max_new_tokens, do_sample=False)[0]
            out = target.get_decoder()(sequence[None], output_hidden_states=True)
            sample = {"ids": sequence, "start": len(ids), "features": out.last_hidden_state[0]}
            inputs, tokens, targets, mask = _collate([sample], target.config.hidden_size)
            if not mask.any():
                continue
            length = inputs.shape[1]
            attention = additive_mask(torch.ones(length, length, dtype=torch.bool).tril(), target.dtype)[None, None]
            predicted = draft_head(inputs.to(target.dtype), embed(tokens), torch.arange(1, length + 1)[None],
                                   attention, None)
            p_rows.append(lm_head(targets[mask].to(target.dtype)).half())
            eagle_rows.append(lm_head(predicted[mask]).half())
            shallow = out.hidden_states[layers][0, 1:][mask[0]]
            truncated_rows.append(lm_head(norm(shallow)).half())
        gathered += int(mask.sum())
        sources.append(question["question_id"])
    if gathered < positions:
        raise UsageError(f"task {task} gave only {gathered} positions, fewer than {positions}: lower --positions")
    return {"p": torch.cat(p_rows)[:positions], "eagle": torch.cat(eagle_rows)[:positions],
            "truncated": torch.cat(truncated_rows)[:positions], "question_ids": sources, "layers": layers}


def read_task(path: Path) -> dict:
    """A task file `collect` wrote; one that cannot be read (cut short by a full disk or a copy) or holds no
    collected positions is a one-line error naming it."""
    fix = "delete it and run `eagle-mdsd study collect` again to collect it anew"
    data = checkpoint.load_saved(path, "task file", fix, mmap=True)  # (mapped: checking a rerun's files reads little)
    if not (isinstance(data, dict) and all(isinstance(data.get(key), torch.Tensor) for key in ("p", *DRAFTS))
            and isinstance(data.get("settings", {}), dict)):
        raise UsageError(f"task file {path} holds no collected positions: {fix}")
    shape = data["p"].shape  # [positions, V] logits, the drafts' alike
    if len(shape) != 2 or shape[0] == 0 or any(data[key].shape != shape for key in DRAFTS):
        raise UsageError(f"task file {path} holds logits of shapes {[tuple(data[k].shape) for k in ('p', *DRAFTS)]}, "
                         f"not one [positions, vocabulary] shape: {fix}")
    return data


def check_task(path: Path, settings: dict) -> None:
    """Refuse to reuse a task file collected with other `settings` than a rerun's.  A file written before task
    files recorded their settings shows only its positions, in its rows."""
    data = read_task(path)
    made = {"positions": len(data["p"])} | data.get("settings", {})
    changed = [f"{key} {made[key]} -> {value}" for key, value in settings.items() if made.get(key, value) != value]
    if changed:
        raise UsageError(f"task file {path} was collected with other settings ({'; '.join(changed)}): pass the "
                         f"options it was collected with, or another --run, or delete it to collect it anew")


def collect(run: Path, positions: int = 1024, max_new_tokens: int = 128, dtype: str = "bfloat16",
            tasks=TASKS) -> list[Path]:
    """One file per task in run/; tasks already collected with the same settings are skipped, and a file of
    other settings is refused (`check_task`) before the model loads."""
    run = Path(run)
    run.mkdir(parents=True, exist_ok=True)
    settings = {"positions": positions, "max_new_tokens": max_new_tokens, "dtype": dtype,
                "head": checkpoint.head_checksum(models.DEFAULT_HEAD)}
    todo = [t for t in tasks if not (run / f"{t}.pt").exists()]
    written = [run / f"{t}.pt" for t in tasks if t not in todo]
    for path in written:
        check_task(path, settings)
    if not todo:
        return written
    target, tokenizer = models.load_target(None, models.parse_dtype(dtype))
    draft_head = head.load_head(models.DEFAULT_HEAD, target)
    layers = target.config.num_hidden_layers // 3
    for task in tqdm(todo, desc="collect p and q"):
        data = _task_positions(target, draft_head, tokenizer, task, positions, max_new_tokens, layers)
        staging = run / f".{task}.pt.tmp"
        torch.save(data | {"settings": settings}, staging)
        os.replace(staging, run / f"{task}.pt")
        for draft in DRAFTS:  # cached rates derive from the task file: those of an earlier file are stale
            for stale in (run / "rates").glob(f"{task}_{draft}_t*.pt"):
                stale.unlink()
        written.append(run / f"{task}.pt")
    return written


# -- analysis --------------------------------------------------------------------------------


def _support(x: torch.Tensor, epsilon: float) -> torch.Tensor:
    """The most probable tokens of x that hold all but `epsilon` of its mass."""
    values, order = torch.sort(x, descending=True)
    count = int(torch.searchsorted(values.cumsum(0), torch.tensor(1.0 - epsilon, dtype=x.dtype))) + 1
    return order[: min(count, len(x))]


def truncate(p: torch.Tensor, q: torch.Tensor, n: int, epsilon: float = EPSILON,
             min_size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """p and q on the union of the (1 - epsilon)-supports of p, of q and of q without its n - 1 most probable
    tokens (where one token holds nearly all of q, the tail a single bucket would stand for is most of what the
    later draws see), and at least q's max(min_size, n + 1) most probable tokens (so that n drafts without
    replacement exist), plus one bucket for the rest (float64)."""
    order = torch.sort(q, descending=True, stable=True).indices
    later, parts = q[order[n - 1 :]], [_support(p, epsilon), _support(q, epsilon), order[: max(min_size, n + 1)]]
    if later.sum() > 0:
        parts.append(order[n - 1 :][_support(later / later.sum(), epsilon)])
    keep = torch.unique(torch.cat(parts))
    p_kept, q_kept = p[keep], q[keep]
    rest = [(1.0 - p_kept.sum()).clamp_min(0.0), (1.0 - q_kept.sum()).clamp_min(0.0)]
    p_out, q_out = torch.cat([p_kept, rest[0][None]]), torch.cat([q_kept, rest[1][None]])
    return p_out / p_out.sum(), q_out / q_out.sum()


def position_rates(p: torch.Tensor, q: torch.Tensor, n: int, generator: torch.Generator,
                   draws: int = 8) -> dict[str, float]:
    """alpha* per scheme and each verifier's acceptance at one position (float64 p, q over a small support)."""
    rates = {f"alpha*:{scheme}": theory.optimal_acceptance(p, q, n, scheme) for scheme in ALPHAS}
    rates["alpha*:spechub"] = theory.optimal_acceptance(p, q, 2, "spechub")
    rates["kseq"] = float(verification.kseq_acceptance(p, q, n))
    for name, (scheme, _) in VERIFIERS.items():
        if name == "kseq":
            continue
        count = 2 if name == "spechub" else n
        drafts = drafting.get(scheme).sample_batch(q.expand(draws, -1), count, generator)
        plans = verification.get(name).plan(p, q, drafts)
        rates[name] = float(theory._accepted_mass(plans, drafts).mean())
    return rates


def rates_for(logits_p: torch.Tensor, logits_q: torch.Tensor, temperature: float, n: int, seed: int = 0,
              draws: int = 8) -> dict[str, torch.Tensor]:
    """Per-position rates over rows of logits: {quantity: tensor[positions]}."""
    generator = torch.Generator().manual_seed(seed)
    columns: dict[str, list[float]] = {}
    for lp, lq in zip(logits_p, logits_q):
        p = warp(lp.float(), temperature).double()
        q = warp(lq.float(), temperature).double()
        for key, value in position_rates(*truncate(p, q, n), n, generator, draws).items():
            columns.setdefault(key, []).append(value)
    return {key: torch.tensor(values, dtype=torch.float64) for key, values in columns.items()}


def summarise(rates: dict[str, torch.Tensor]) -> dict[str, dict]:
    """Mean, 95% half-width, and for verifiers the paired gap to their alpha*."""
    out = {}
    for key, values in rates.items():
        entry = {"mean": float(values.mean()), "ci95": 1.96 * float(values.std()) / math.sqrt(len(values))}
        if key in VERIFIERS:
            gap = rates[f"alpha*:{VERIFIERS[key][1]}"] - values
            entry |= {"gap": float(gap.mean()), "gap_ci95": 1.96 * float(gap.std()) / math.sqrt(len(gap))}
        out[key] = entry
    return out


def _cached_rates(run: Path, task: str, draft: str, temperature: float, n: int, limit: int | None,
                  draws: int) -> dict[str, torch.Tensor]:
    cache = run / "rates" / f"{task}_{draft}_t{temperature:g}_n{n}_{limit or 'all'}_d{draws}.pt"
    if cache.exists():  # a cache that cannot be read (cut short, damaged, replaced) is computed anew
        try:
            cached = checkpoint.load_saved(cache, "cached rates", "")
        except UsageError:
            cached = None
        if isinstance(cached, dict) and cached and all(isinstance(v, torch.Tensor) and v.dim() == 1
                                                       for v in cached.values()):
            return cached
    data = read_task(run / f"{task}.pt")
    rows = slice(None, limit)
    rates = rates_for(data["p"][rows], data[draft][rows], temperature, n, seed=n * 1000 + int(100 * temperature),
                      draws=draws)
    cache.parent.mkdir(parents=True, exist_ok=True)
    staging = cache.with_suffix(".tmp")
    torch.save(rates, staging)
    os.replace(staging, cache)
    return rates


def analyse(run: Path, out_dir: Path, temperature: float = 0.7, n: int = 3, draws: int = 8,
            sweep_positions: int = 48, sweep_temperatures=(0.0, 0.2, 0.4, 0.7, 1.0, 1.2),
            sweep_drafts=tuple(range(1, 9)), tasks=TASKS, table_positions: int | None = None) -> Path:
    """The table (every task and draft) and the two sweeps (pooled over tasks), into out_dir."""
    run, out_dir = Path(run), Path(out_dir)
    missing = [t for t in tasks if not (run / f"{t}.pt").exists()]
    if missing:
        raise MissingFile(f"no collected positions for {', '.join(missing)} in {run}: run `eagle-mdsd study "
                                f"collect --run {run}` first")
    table = {}
    for task in tqdm(tasks, desc=f"table T={temperature:g} n={n}"):
        for draft in DRAFTS:
            table[task, draft] = summarise(_cached_rates(run, task, draft, temperature, n, table_positions, draws))
    sweeps = {"temperature": {}, "drafts": {}}
    settings = [("temperature", t, t, n) for t in sweep_temperatures] + [("drafts", k, temperature, k)
                                                                         for k in sweep_drafts]
    for kind, x, t, k in tqdm(settings, desc="sweeps"):
        for draft in DRAFTS:
            pooled: dict[str, list[torch.Tensor]] = {}
            for task in tasks:
                for key, values in _cached_rates(run, task, draft, t, k, sweep_positions, draws).items():
                    pooled.setdefault(key, []).append(values)
            sweeps[kind][f"{draft}:{x:g}"] = summarise({key: torch.cat(v) for key, v in pooled.items()})
    date = datetime.date.today().isoformat()
    result = {"date": date, "machine": machine(), "temperature": temperature, "n": n, "draws": draws,
              "epsilon": EPSILON, "positions": {t: len(read_task(run / f"{t}.pt")["p"])
                                                for t in tasks}, "table_positions": table_positions,
              "table": {f"{task}:{draft}": value for (task, draft), value in table.items()}, "sweeps": sweeps,
              "sweep_positions": sweep_positions}
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"acceptance_study_{date}"
    outputs.write_atomically(stem.with_suffix(".json"), json.dumps(result, indent=1))
    _plots(result, stem)
    outputs.write_atomically(stem.with_suffix(".md"), markdown(result, stem.name, tasks))
    return stem.with_suffix(".md")


ROWS = [("rrs_w", "RRS with replacement"), ("kseq", "K-SEQ"), ("alpha*:with_replacement", "alpha* with replacement"),
        ("rrs_wo", "RRS without replacement"), ("alpha*:without_replacement", "alpha* without replacement"),
        ("greedy", "greedy verifier"), ("alpha*:greedy", "alpha* greedy drafting"),
        ("spechub", "SpecHub (n = 2)"), ("alpha*:spechub", "alpha* SpecHub drafting (n = 2)")]


def _used(limit: int | None) -> str:
    return "all of them" if limit is None else f"the first {limit} of each task"


def markdown(result: dict, stem: str, tasks=TASKS) -> str:
    m = result["machine"]
    lines = [f"# Acceptance study, {result['date']}", "",
             f"Machine: {m['cpu']}, torch {m['torch']}. Target: the embedded SmolLM2-135M-Instruct (bf16), its own "
             f"greedy answers to Spec-Bench first turns; positions collected per task: "
             f"{', '.join(f'{t} {c}' for t, c in result['positions'].items())}; the table uses "
             f"{_used(result.get('table_positions'))}. Drafts: `eagle` (the shipped head, "
             f"teacher-forced) and `truncated` (the target's first third of layers + final norm + lm_head). "
             f"T = {result['temperature']:g} for p and q, n = {result['n']} drafts (SpecHub: 2). Verifier rates: "
             f"mean over positions of the exact accepted mass of the plan for {result['draws']} sampled draft tuples "
             f"each; p and q truncated to all but {result['epsilon']:g} of their mass. Cells: mean +- 95% half-width; "
             f"for verifiers, [gap to its alpha*, paired, +- 95%].", ""]
    for draft in DRAFTS:
        lines += [f"## Draft: {draft}", "", "| | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
        for key, label in ROWS:
            cells = []
            for task in tasks:
                entry = result["table"][f"{task}:{draft}"][key]
                cell = f"{entry['mean']:.4f} +- {entry['ci95']:.4f}"
                if "gap" in entry:
                    cell += f" [{entry['gap']:+.4f} +- {entry['gap_ci95']:.4f}]"
                cells.append(cell)
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [f"![temperature sweep]({stem}_temperature.png)", "", f"![draft-count sweep]({stem}_drafts.png)", "",
              f"Sweeps pool the first {result['sweep_positions']} positions of every task."]
    return "\n".join(lines) + "\n"


def _plots(result: dict, stem: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for kind, xlabel in (("temperature", "temperature"), ("drafts", "number of drafts n")):
        figure, axes = plt.subplots(1, len(DRAFTS), figsize=(11, 4), sharey=True)
        for axis, draft in zip(axes, DRAFTS):
            points = {float(key.split(":")[1]): value for key, value in result["sweeps"][kind].items()
                      if key.startswith(draft + ":")}
            xs = sorted(points)
            for key, label in ROWS:
                if key in ("alpha*:spechub", "spechub") and kind == "drafts":
                    continue
                style = "--" if key.startswith("alpha*") else "-"
                axis.errorbar(xs, [points[x][key]["mean"] for x in xs], yerr=[points[x][key]["ci95"] for x in xs],
                              fmt=style, marker="o", markersize=3, label=label, capsize=2)
            axis.set_title(f"draft: {draft}")
            axis.set_xlabel(xlabel)
        axes[0].set_ylabel("acceptance rate")
        axes[-1].legend(fontsize="x-small")
        figure.tight_layout()
        figure.savefig(stem.with_name(f"{stem.name}_{kind}.png"), dpi=110)
        plt.close(figure)
