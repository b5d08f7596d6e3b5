"""Reports over answer files: tokens/s, speedup against a baseline file, tau, per category.

Every number is recomputed from the files: tokens are the generated ids
(`new_tokens`), time is the wall time of each turn (prefill included), tau is
tokens / target cycles (`idxs`), acceptance by depth comes from the tokens
of each cycle (`accept_lengths`, accepted drafts + 1).  Two tokens/s of a
group: its total tokens over its total seconds, and the mean over its questions
of each question's tokens over seconds (how Spec-Bench's and EAGLE's speed.py
compute speed; their speedup is the ratio of those means).  A speedup compares
a method with the baseline on the questions both files answered.

A file whose rows record different settings (`bench` refuses to write one, a
hand-joined file can hold one) is refused unless `mixed_settings` asks to
average them; rows without settings (files written before rows recorded
them) count as one setting of their own, so an older file reads as before.

A ratio between two files (a speedup over the baseline, a paired tau) is made
only between answers of the same base model, dtype, temperature, token limit,
turns and bench (the same question ids in the same categories): a difference
is refused unless `across` names it, and then the page says it.  A setting a
row does not record (an older file) is not compared.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from . import bench, outputs
from .errors import UsageError

# the cycle's timed phases (engine.PhaseTimer), then those of answers timed before the one cycle, in their order
PHASES = ("draft", "target", "verify", "commit")
MAX_DEPTH = 8  # columns of the acceptance-by-depth table


def acceptance_by_depth(lengths: list[int]) -> list[float]:
    """For d = 1, 2, ...: of the cycles that accepted d - 1 drafts, the share that accepted a d-th too."""
    rates = []
    for depth in range(1, max(lengths, default=1)):
        reached = sum(n >= depth for n in lengths)
        rates.append(sum(n >= depth + 1 for n in lengths) / reached)
    return rates


def tau_by_position(rows: list[dict], window: int) -> list[tuple[int, int]]:
    """(tokens, cycles) of the cycles grouped by where in their answer turn they start: entry k holds the
    cycles whose first token is at position k * window .. (k + 1) * window - 1.  Position 0 is the token
    sampled after the prefill (no cycle), so a turn's first cycle starts at 1; tokens are the cycles'
    `accept_lengths`, so a last cycle cut at max_new_tokens counts in full."""
    windows: list[list[int]] = []
    for row in rows:
        for lengths in bench.turn_lengths(row["choices"][0]):
            position = 1
            for length in lengths:
                k = position // window
                windows.extend([0, 0] for _ in range(k + 1 - len(windows)))
                windows[k][0] += length
                windows[k][1] += 1
                position += length
    return [(tokens, cycles) for tokens, cycles in windows]


def _totals(rows: list[dict]) -> dict:
    tokens = sum(sum(r["choices"][0]["new_tokens"]) for r in rows)
    cycles = sum(sum(r["choices"][0]["idxs"]) for r in rows)
    seconds = sum(sum(r["choices"][0]["wall_time"]) for r in rows)
    rates = [sum(r["choices"][0]["new_tokens"]) / sum(r["choices"][0]["wall_time"]) for r in rows
             if sum(r["choices"][0]["wall_time"]) > 0]
    totals = {"questions": len(rows), "new_tokens": tokens, "cycles": cycles, "wall_time_s": seconds,
              "tau": tokens / cycles if cycles else float("nan"),
              "tokens_per_s": tokens / seconds if seconds else float("nan"),
              "mean_question_tokens_per_s": statistics.fmean(rates) if rates else float("nan")}
    lengths = [n for r in rows for turn in bench.turn_lengths(r["choices"][0]) for n in turn]
    if lengths and max(lengths) > 1:
        totals["acceptance_by_depth"] = acceptance_by_depth(lengths)
    profiled = [r["choices"][0] for r in rows if r["choices"][0].get("profile")]
    profiles, profiled_cycles = [turn for c in profiled for turn in c["profile"]], sum(sum(c["idxs"]) for c in profiled)
    if profiles and profiled_cycles:  # over the cycles of the profiled answers alone
        totals["ms_per_cycle"] = {phase: 1000 * sum(p.get(phase, 0.0) for p in profiles) / profiled_cycles
                                  for phase in PHASES if any(phase in p for p in profiles)}
    return totals


def question_tau(rows: list[dict]) -> dict:
    """Tau of each question: its tokens / its target cycles over all its turns."""
    return {row["question_id"]: sum(row["choices"][0]["new_tokens"]) / sum(row["choices"][0]["idxs"])
            for row in rows if sum(row["choices"][0]["idxs"])}


def paired_tau(reference: dict, other: dict) -> dict:
    """other's per-question tau minus reference's on the questions both answered: mean, its standard error
    (sample standard deviation / sqrt(n)), and on how many questions other is higher or lower."""
    shared = sorted(set(reference) & set(other))
    differences = [other[q] - reference[q] for q in shared]
    return {"questions": len(shared), "mean": statistics.fmean(differences) if shared else float("nan"),
            "standard_error": statistics.stdev(differences) / len(shared) ** 0.5 if len(shared) > 1
            else float("nan"),
            "higher": sum(d > 0 for d in differences), "lower": sum(d < 0 for d in differences)}


def question_rates(rows: list[dict]) -> list[list]:
    """[question id, its tokens / its seconds over all turns] per question, in the file's order (the order run)."""
    return [[row["question_id"], sum(row["choices"][0]["new_tokens"]) / sum(row["choices"][0]["wall_time"])]
            for row in rows if sum(row["choices"][0]["wall_time"]) > 0]


def drafted(rows: list[dict], totals: dict) -> bool:
    """Whether a file's answers come from a method that drafts (by the method its rows record, else by a cycle
    that accepted a draft): one whose drafts were all rejected still drafted."""
    method = (rows[0].get("settings") or {}).get("method")
    return method not in PLAIN if method else "acceptance_by_depth" in totals


def same_questions(entry: dict, other: dict) -> bool:
    """Whether two entries answered the same questions, so that a ratio of their totals compares like with
    like (entries of older results, which kept no per-question rates, are taken as paired)."""
    mine, theirs = entry.get("question_tokens_per_s"), other.get("question_tokens_per_s")
    return mine is None or theirs is None or {q for q, _ in mine} == {q for q, _ in theirs}


def spread_markdown(entries: list[dict], listed: int = 12) -> list[str]:
    """Lines on how each entry's per-question tokens/s spread (min, median, max, and the first half of its
    questions over the second, in the order run: a drifting machine shows there), every question's rate where
    there are at most `listed`; and whether every entry answered the same questions (paired) or which differ.
    Empty for entries of older results, which kept no per-question rates."""
    rated = [e for e in entries if e.get("question_tokens_per_s")]
    if not rated:
        return []
    asked = {e["label"]: [q for q, _ in e["question_tokens_per_s"]] for e in rated}
    every = sorted({q for ids in asked.values() for q in ids})
    lacking = {label: [q for q in every if q not in ids] for label, ids in asked.items()}
    if any(lacking.values()):
        paired = ["Not paired: the rows answered different questions (" + "; ".join(
            f"{label} lacks {', '.join(map(str, ids))}" for label, ids in lacking.items() if ids) + ")."]
    else:
        paired = [f"Paired: every row answered the same {len(every)} questions."]
    shown = len(every) <= listed
    lines = ["", *paired, "", "Per question tokens/s (a question's tokens over its seconds, all turns; first half / "
             "second half: the mean rate of the first half of the questions run over the second half's):", "",
             "| method | min | median | max | first half / second half |"
             + ("".join(f" {q} |" for q in every) if shown else ""),
             "|---|---|---|---|---|" + ("---|" * len(every) if shown else "")]
    for entry in rated:
        rates = dict((q, r) for q, r in entry["question_tokens_per_s"])
        ordered = [r for _, r in entry["question_tokens_per_s"]]
        half = len(ordered) // 2
        later = statistics.fmean(ordered[-half:]) if half else 0.0
        drift = f"{statistics.fmean(ordered[:half]) / later:.2f}" if later > 0 else "-"  # (answers of 0 tokens)
        lines.append(f"| {entry['label']} | {min(ordered):.1f} | {statistics.median(ordered):.1f} | "
                     f"{max(ordered):.1f} | {drift} |"
                     + ("".join(f" {rates[q]:.1f} |" if q in rates else " - |" for q in every) if shown else ""))
    return lines


def _by_category(rows: list[dict]) -> dict[str, list[dict]]:
    """The rows overall ('all') and by category; a category named 'all' is listed as 'all (category)'."""
    groups: dict[str, list[dict]] = {"all": rows}
    for row in rows:
        category = row.get("category") or "unknown"
        groups.setdefault("all (category)" if category == "all" else category, []).append(row)
    return groups


def one_setting(rows: list[dict], answer_file: Path, mixed_settings: bool = False) -> list[dict]:
    """`rows`, after a one-line error if they record more than one setting and `mixed_settings` is False."""
    kinds = list(dict.fromkeys(json.dumps(row.get("settings"), sort_keys=True) for row in rows))
    if len(kinds) > 1 and not mixed_settings:
        first, other = (json.loads(kind) for kind in kinds[:2])
        difference = (bench.settings_difference(first, other) if first is not None and other is not None
                      else "some rows record no settings")
        raise UsageError(f"answer file {answer_file} holds answers of {len(kinds)} settings ({difference}): report "
                         f"one file a setting, or pass --mixed-settings to average them")
    return rows


PLAIN = ("baseline", "hf_generate", "hf_compiled")  # methods that decode a token a forward
COMPARED = ("base_model", "dtype", "temperature", "max_new_tokens", "turns")  # what a ratio holds equal
ACROSS = COMPARED + ("bench",)  # the differences `across` can name


def differences(rows: list[dict], other_rows: list[dict]) -> dict[str, tuple]:
    """{setting: (its value in rows, in other_rows)} where two files' answers differ: the COMPARED settings both
    record (their first rows'), and 'bench' where a question id of both stands in two categories."""
    mine, theirs = rows[0].get("settings") or {}, other_rows[0].get("settings") or {}
    found = {key: (mine[key], theirs[key]) for key in COMPARED if key in mine and key in theirs
             and mine[key] != theirs[key]}
    categories = {row["question_id"]: row.get("category") for row in other_rows}
    for row in rows:
        other = categories.get(row["question_id"])
        if other and row.get("category") and row["category"] != other:
            found["bench"] = (f"question {row['question_id']} in {row['category']}", f"in {other}")
            break
    return found


def comparable(path: Path, rows: list[dict], other: Path, other_rows: list[dict], what: str,
               across: tuple = ()) -> list[str]:
    """The page's notes on how `path`'s answers differ from `other`'s (the `what` they are compared with) in
    the settings `across` names; a one-line error on any other difference."""
    found = differences(rows, other_rows)
    refused = [key for key in found if key not in across]
    if refused:
        said = "; ".join(f"{key} ({_shown(found[key][0])} against {_shown(found[key][1])})" for key in refused)
        raise UsageError(f"answer file {path} and {what} {other} differ in {said}, so a ratio between them would "
                         f"measure that too: compare answers made alike, or pass --across {','.join(refused)} to "
                         f"compare them anyway")
    return [f"{Path(path).name} against {what} {Path(other).name}: compared across a different {key} "
            f"({_shown(found[key][0])} against {_shown(found[key][1])})." for key in found]


def _shown(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def summarise(answer_file: Path) -> dict[str, dict]:
    """Totals (tau, tokens/s, ...) per category and overall ('all') of one answer file."""
    return {name: _totals(group) for name, group in _by_category(bench.read_rows(answer_file)).items()}


def _over_baseline(group: list[dict], base_rows: dict) -> dict:
    """A category's speedups over the baseline's answers to the same questions (nan where it answered none)."""
    shared = [r for r in group if r["question_id"] in base_rows]
    if not shared:
        return {"speedup": math.nan, "baseline_tokens_per_s": math.nan, "mean_question_speedup": math.nan}
    mine, theirs = _totals(shared), _totals([base_rows[r["question_id"]] for r in shared])
    return {"speedup": _ratio(mine["tokens_per_s"], theirs["tokens_per_s"]),
            "baseline_tokens_per_s": theirs["tokens_per_s"],
            "mean_question_speedup": _ratio(mine["mean_question_tokens_per_s"], theirs["mean_question_tokens_per_s"])}


def _ratio(mine: float, theirs: float) -> float:
    """mine / theirs; nan (shown as '-') where the baseline's rate is 0 (answers of 0 tokens) or nan."""
    return mine / theirs if theirs > 0 else math.nan


def compare(answer_files: list[Path], baseline: Path | None = None, labels: list[str] | None = None,
            paired: bool = False, window: int | None = None, mixed_settings: bool = False,
            across: tuple = ()) -> list[dict]:
    """One entry per answer file: its label and, per category, totals and the speedup over `baseline`; with
    `paired`, each drafting file's tau per question against the first drafting file's (`paired_tau`); with
    `window`, each drafting file's tau by position in the answer (`tau_by_position`, all categories).  A file of
    several settings is refused unless `mixed_settings` (`one_setting`), and a ratio between files of different
    settings unless `across` names the difference (`comparable`; the entry's 'across' notes say it)."""
    if window is not None and window < 1:
        raise UsageError(f"--window is {window}: pass a number of tokens of 1 or more")
    unknown = [key for key in across if key not in ACROSS]
    if unknown:
        raise UsageError(f"--across {','.join(unknown)}: name settings among {', '.join(ACROSS)}")
    base_list = one_setting(bench.read_rows(baseline), baseline, mixed_settings) if baseline else []
    base_rows = {r["question_id"]: r for r in base_list}
    if baseline and not base_rows:
        raise UsageError(f"baseline answer file {baseline} is missing or empty: run its benchmark first")
    entries, taus = [], []
    for i, path in enumerate(answer_files):
        rows = one_setting(bench.read_rows(path), path, mixed_settings)
        if not rows:
            raise UsageError(f"answer file {path} is missing or empty: run `eagle-mdsd bench` to write it")
        notes = comparable(path, rows, baseline, base_list, "baseline", across) if baseline else []
        if base_rows and not any(r["question_id"] in base_rows for r in rows):
            raise UsageError(f"baseline {baseline} answers none of the questions of {path}: give a baseline "
                             f"answered on the same questions")
        categories = {name: _totals(group) | (_over_baseline(group, base_rows) if base_rows else {})
                      for name, group in _by_category(rows).items()}
        label = labels[i] if labels else rows[0].get("model_id") or Path(path).stem
        entries.append({"label": label, "file": str(path), "categories": categories,
                        "question_tokens_per_s": question_rates(rows)} | ({"across": notes} if notes else {}))
        if paired and drafted(rows, categories["all"]):
            if taus:
                first = taus[0][0]["file"]
                entries[-1].setdefault("across", []).extend(
                    comparable(path, rows, first, taus[0][2], "the paired file", across))
            taus.append((entries[-1], question_tau(rows), rows))
        if window and "acceptance_by_depth" in categories["all"]:
            entries[-1]["tau_by_position"] = {"window": window, "windows": tau_by_position(rows, window)}
    for entry, tau, _ in taus[1:]:
        entry["paired_tau"] = {"against": taus[0][0]["label"], **paired_tau(taus[0][1], tau)}
    return entries


def markdown(entries: list[dict], over: str | tuple = ()) -> str:
    """The overall table, the per-category table and, for profiled files, the time per phase; for each label in
    `over` (one or several) that an entry carries, the overall table also gives every entry's tokens/s over that
    entry's ("x OVER")."""
    with_speedup = all("speedup" in e["categories"]["all"] for e in entries)
    lines = _overall_table(entries, over, with_speedup) + spread_markdown(entries)
    for section in (_category_table(entries, with_speedup), _depth_table(entries), _paired_table(entries),
                    _position_table(entries), _phase_table(entries)):
        lines += section
    return "\n".join(lines) + "\n"


def _overall_table(entries: list[dict], over: str | tuple, with_speedup: bool) -> list[str]:
    """Every entry's totals, its speedup over the baseline (where every entry has one) and its tokens/s over
    each label of `over` that an entry carries; then what the columns mean."""
    speeds = {e["label"]: e["categories"]["all"]["tokens_per_s"] for e in entries}
    by_label = {e["label"]: e for e in entries}
    peers = [label for label in ((over,) if isinstance(over, str) else over or ()) if label in speeds]
    lines = ["| method | questions | new tokens | tau | tokens/s | tokens/s, mean of questions |"
             + (" speedup | speedup, mean of questions |" if with_speedup else "")
             + "".join(f" x {label} |" for label in peers),
             "|---|---|---|---|---|---|" + ("---|---|" if with_speedup else "") + "---|" * len(peers)]
    for entry in entries:
        total = entry["categories"]["all"]
        mean_rate = total.get("mean_question_tokens_per_s", float("nan"))
        lines.append(f"| {entry['label']} | {total['questions']} | {total['new_tokens']} | {total['tau']:.2f} | "
                     f"{total['tokens_per_s']:.1f} | {mean_rate:.1f} |"
                     + (f" {_times(total['speedup'])} | {_times(total['mean_question_speedup'])} |" if with_speedup
                        else "")
                     + "".join(f" {_times(_ratio(total['tokens_per_s'], speeds[label]))} |" if same_questions(
                         entry, by_label[label]) else " - |" for label in peers))
    return lines + ["", "tokens/s: total new tokens over total time (every turn's wall time, prefill included). "
                    "tokens/s, mean of questions: the mean over questions of each question's tokens over its time, "
                    "as Spec-Bench's and EAGLE's speed.py compute it; their speedup is the ratio of those means."
                    + (" x METHOD: - where the two rows answered different questions." if any(
                        not same_questions(e, by_label[label]) for e in entries for label in peers) else "")]


def _times(ratio: float) -> str:
    return "-" if math.isnan(ratio) else f"{ratio:.2f}x"


def _category_table(entries: list[dict], with_speedup: bool) -> list[str]:
    """Per category, each entry's speedup (or tokens/s) and tau; nothing where the files name no category."""
    categories = sorted({c for e in entries for c in e["categories"] if c != "all"})
    if not categories:
        return []
    what = "speedup (tau)" if with_speedup else "tokens/s (tau)"
    lines = ["", f"Per category, {what}:", "", "| method | " + " | ".join(categories) + " |",
             "|---|" + "---|" * len(categories)]
    for entry in entries:
        cells = []
        for category in categories:
            c = entry["categories"].get(category)
            value = None if c is None else (c["speedup"] if with_speedup else c["tokens_per_s"])
            shown = "-" if value is None or math.isnan(value) else f"{value:.2f}"  # nan: the baseline lacks them
            cells.append("-" if c is None else f"{shown} ({c['tau']:.2f})")
        lines.append(f"| {entry['label']} | " + " | ".join(cells) + " |")
    return lines


def _depth_table(entries: list[dict]) -> list[str]:
    """The acceptance by depth of the entries that drafted."""
    drafted = [e for e in entries if "acceptance_by_depth" in e["categories"]["all"]]
    if not drafted:
        return []
    depths = min(MAX_DEPTH, max(len(e["categories"]["all"]["acceptance_by_depth"]) for e in drafted))
    lines = ["", "Acceptance by depth (of the cycles that accepted d - 1 drafts, the share that accepted a "
             "d-th):", "", "| method | " + " | ".join(f"d = {d}" for d in range(1, depths + 1)) + " |",
             "|---|" + "---|" * depths]
    for entry in drafted:
        rates = entry["categories"]["all"]["acceptance_by_depth"]
        lines.append(f"| {entry['label']} | " + " | ".join(f"{rates[d]:.3f}" if d < len(rates) else "-"
                                                           for d in range(depths)) + " |")
    return lines


def _paired_table(entries: list[dict]) -> list[str]:
    """Tau per question against the first drafting file, for the entries paired with it."""
    paired = [e for e in entries if "paired_tau" in e]
    if not paired:
        return []
    lines = ["", f"Tau per question against {paired[0]['paired_tau']['against']} (a question's tau: its "
             "tokens / its cycles, all turns; paired over the questions both answered):", "",
             "| method | questions | mean difference | standard error | higher | lower |",
             "|---|---|---|---|---|---|"]
    for entry in paired:
        t = entry["paired_tau"]
        lines.append(f"| {entry['label']} | {t['questions']} | {t['mean']:+.3f} | {t['standard_error']:.3f} | "
                     f"{t['higher']} | {t['lower']} |")
    return lines


def _position_table(entries: list[dict]) -> list[str]:
    """Tau by position in the answer turn, for the entries that carry it."""
    positioned = [e for e in entries if "tau_by_position" in e]
    if not positioned:
        return []
    window = positioned[0]["tau_by_position"]["window"]
    count = max(len(e["tau_by_position"]["windows"]) for e in positioned)
    lines = ["", f"Tau by position in the answer turn (cycles grouped by the position of their first token, "
             f"{window} tokens a column; tokens from accept_lengths):", "",
             "| method | " + " | ".join(f"{k * window}-{(k + 1) * window - 1}" for k in range(count)) + " |",
             "|---|" + "---|" * count]
    for entry in positioned:
        windows = entry["tau_by_position"]["windows"]
        lines.append(f"| {entry['label']} | " + " | ".join(
            f"{windows[k][0] / windows[k][1]:.2f}" if k < len(windows) and windows[k][1] else "-"
            for k in range(count)) + " |")
    return lines


def _phase_table(entries: list[dict]) -> list[str]:
    """Where a cycle's time goes, for profiled files."""
    profiled = [e for e in entries if "ms_per_cycle" in e["categories"]["all"]]
    if not profiled:
        return []
    timed = [entry["categories"]["all"]["ms_per_cycle"] for entry in profiled]
    shown = [phase for phase in PHASES if any(phase in ms for ms in timed)]  # the phases some file timed
    lines = ["", "Where a cycle's time goes (ms per target cycle):", "",
             "| method | " + " | ".join(shown) + " | sum |", "|---|" + "---|" * (len(shown) + 1)]
    for entry, ms in zip(profiled, timed):
        lines.append(f"| {entry['label']} | " + " | ".join(f"{ms[p]:.1f}" if p in ms else "-" for p in shown)
                     + f" | {sum(ms.values()):.1f} |")
    return lines


def bar_chart(entries: list[dict], png: Path, baseline: Path | None = None) -> Path:
    """Grouped bars per category: speedup over the baseline (or tokens/s without one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = "speedup" if baseline is not None else "tokens_per_s"
    categories = ["all"] + sorted({c for e in entries for c in e["categories"] if c != "all"})
    width = 0.8 / max(len(entries), 1)
    figure, axes = plt.subplots(figsize=(max(6, 1.2 * len(categories)), 4))
    for i, entry in enumerate(entries):
        values = [entry["categories"].get(c, {}).get(key, float("nan")) for c in categories]
        axes.bar([x + i * width for x in range(len(categories))], values, width, label=entry["label"])
    if baseline is not None:
        axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xticks([x + width * (len(entries) - 1) / 2 for x in range(len(categories))], categories,
                    rotation=30, ha="right")
    axes.set_ylabel("speedup over baseline" if baseline is not None else "tokens/s")
    axes.legend(fontsize="small")
    figure.tight_layout()
    try:
        return outputs.save_figure(figure, png, dpi=120)
    finally:
        plt.close(figure)  # also when interrupted: pyplot keeps every open figure


def write(answer_files: list[Path], out: Path, baseline: Path | None = None, title: str = "",
          labels: list[str] | None = None, paired: bool = False, window: int | None = None,
          mixed_settings: bool = False, across: tuple = ()) -> tuple[Path, Path]:
    """out.md (the tables) and out.png (the chart), each written whole, the page last: an interrupted report
    leaves the earlier page as it was.  The page says every difference `across` let through."""
    entries = compare(answer_files, baseline, labels, paired, window, mixed_settings, across)
    out = Path(out)
    out = out.with_suffix("") if out.suffix in (".md", ".png") else out  # a stem's other dots are its name's
    if not out.name or out.is_dir() or outputs.stem_file(out, ".md").is_dir():
        raise UsageError(f"--out {out} is a folder: give a path and file stem such as {out / 'report'}")
    text = (f"# {title}\n\n" if title else "") + markdown(entries)
    if baseline is not None:
        text += f"\nSpeedup = tokens/s over tokens/s of `{Path(baseline).name}` on the same questions.\n"
    notes = [note for entry in entries for note in entry.get("across", [])]
    if notes:
        text += "\nNot alike: " + " ".join(notes) + "\n"
    png = bar_chart(entries, outputs.stem_file(out, ".png"), baseline)
    return outputs.write_atomically(outputs.stem_file(out, ".md"), text), png
