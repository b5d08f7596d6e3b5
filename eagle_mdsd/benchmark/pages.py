"""The pages of a run, rendered from its result (the JSON written beside them): the benchmark's tables, charts
and measured comparisons, and the sweep's table of cells."""

from __future__ import annotations

import json
from pathlib import Path

from .. import dynamic, outputs, peers, report
from ..benchmarks import machine_line
from .plans import PEER, PEERS
from .records import temperature_tag
from .selection import SPARE_QUESTION


def benchmark_pages(stem: Path, temperatures) -> list[Path]:
    """The files a benchmark run writes: stem.md, stem.json and a chart per temperature."""
    return ([outputs.stem_file(stem, ".md"), outputs.stem_file(stem, ".json")]
            + [stem.with_name(f"{stem.name}_{temperature_tag(t)}.png") for t in temperatures])


def write_benchmark(stem: Path, result: dict, tables: dict) -> None:
    """stem.json, stem.md and stem_tTAG.png per temperature; tables: temperature -> (answer files, their labels,
    the baseline's file or None), compared into result['temperatures']."""
    for t, (answer_files, labels, baseline) in tables.items():
        entries = report.compare(answer_files, baseline, labels=labels)
        report.bar_chart(entries, stem.with_name(f"{stem.name}_{temperature_tag(t)}.png"), baseline)
        result["temperatures"][temperature_tag(t)] = {"entries": entries}
    outputs.write_atomically(outputs.stem_file(stem, ".json"), json.dumps(result, indent=1))
    outputs.write_atomically(outputs.stem_file(stem, ".md"), benchmark_markdown(result, stem.name))


def write_sweep(out: Path, name: str, result: dict) -> Path:
    """out/NAME.json and out/NAME.md of a sweep; returns the page."""
    outputs.write_atomically(out / f"{name}.json", json.dumps(result, indent=1))
    return outputs.write_atomically(out / f"{name}.md", sweep_markdown(result, name))


def sampled_note(result: dict) -> str:
    """'; at T > 0 (static trees) [tree S,] drafter D, verifier V' when the run sampled on another tree or with
    another pair (older runs recorded neither)."""
    pair, tree_name = result.get("sampling_pair"), result.get("sampling_tree", "same")
    if (pair is None or pair == f"{result['drafter']}/{result['verifier']}") and tree_name == "same":
        return ""
    sampled_drafter, sampled_verifier = (pair or f"{result['drafter']}/{result['verifier']}").split("/")
    tree_part = "" if tree_name == "same" else f"tree {tree_name}, "
    return f"; at T > 0 (static trees) {tree_part}drafter {sampled_drafter}, verifier {sampled_verifier}"


def kernels_note(result: dict, with_eagle: bool = True) -> str:
    """The report's sentence on kernels (older runs recorded none: stock); `with_eagle`: EAGLE ran beside
    baseline."""
    if result.get("kernels", "stock") == "stock":
        return ""
    ours = "EAGLE and baseline ran their" if with_eagle else "baseline ran its"
    return (f" {ours} linear layers on prepacked oneDNN bf16 weights (--kernels packed: "
            "faster; the stock kernels' outputs on decoding-sized inputs, a long prefill can round differently), "
            "the transformers peers on stock kernels, as users run them.")


def warmup_note(result: dict) -> str:
    """The page's sentence on the untimed warm-up (older runs warmed up on one short answer and recorded none)."""
    warm = result.get("warmup")
    if not warm:
        return ""
    which = ("a question outside the set" if warm["question"] == SPARE_QUESTION["question_id"]
             else f"question {warm['question']}, outside the set")
    compiled = "".join(f" {label} compiled and allocated its static cache first in {seconds:.0f} s."
                       for label, seconds in warm["compile_s"].items())
    total = sum(warm["warmup_s"].values())
    return (f" Before the clock, every method answered {which} in full at these settings ({total:.0f} s in all, "
            f"not counted).{compiled}")


def comparisons(entries: list[dict], temperature: float) -> list[str]:
    """Measured ratios of one temperature's tokens/s that the table (with its column over PEER) does not give:
    each EAGLE row over prompt lookup, each dynamic tree over the static default, and each EAGLE tree's time a
    cycle (tokens/s = tau / seconds a cycle, so the tau a speed asks for follows from it: docs/benchmarks.md)."""
    speed = {e["label"]: e["categories"]["all"]["tokens_per_s"] for e in entries}
    by_label = {e["label"]: e for e in entries}

    def paired(label, other):  # a ratio of totals compares like with like only over the same questions
        return other in speed and report.same_questions(by_label[label], by_label[other])

    eagles = [label for label in speed if label == "eagle" or label.startswith("eagle[")]
    lines = [f"{label} / prompt_lookup at T={temperature:g}: {speed[label]:.1f} / {speed['prompt_lookup']:.1f} "
             f"tokens/s = {speed[label] / speed['prompt_lookup']:.2f}x" for label in eagles
             if paired(label, "prompt_lookup")]
    static = "eagle[eagle_default]"
    lines += [f"{label} / {static} at T={temperature:g}: {speed[label] / speed[static]:.2f}x" for label in eagles
              if label != static and paired(label, static) and label[6:].split(":")[0] in dynamic.NAMES]
    for entry in entries:
        all_ = entry["categories"]["all"]
        if entry["label"] in eagles and all_.get("cycles"):
            lines.append(f"{entry['label']} at T={temperature:g}: {1000 * all_['wall_time_s'] / all_['cycles']:.1f} "
                         f"ms a cycle (wall time / cycles, prefill included), tau {all_['tau']:.2f}")
    return lines


def _settings_paragraph(result: dict) -> str:
    """The page's paragraph on the questions, EAGLE's settings (where EAGLE ran), the columns and the warm-up."""
    labels = {e["label"] for block in result["temperatures"].values() for e in block["entries"]}
    with_peer, with_compiled = PEER in labels, peers.COMPILED in labels
    with_eagle = any(label == "eagle" or label.startswith("eagle[") for label in labels)
    eagle = (f"; EAGLE: shipped head, tree(s) {', '.join(result['trees'])}, drafter {result['drafter']}, verifier "
             f"{result['verifier']}{sampled_note(result)} (TREE@D/V: that tree's own pair), draft vocabulary "
             f"{result.get('draft_vocab') or 'full'}" if with_eagle else "")
    turns = "both turns" if result["bench"] == "mt_bench" else "every turn"
    return (f"Questions: {result['bench']} {', '.join(map(str, result['questions']))} ({turns}), "
            f"at most {result['max_new_tokens']} new tokens per turn{eagle}. Methods ran question by question in "
            f"turn in one process. Speedup = tokens/s over `baseline` (plain autoregressive decoding in the same loop) "
            f"on the same questions; "
            + (f"x {PEER} = tokens/s over `{PEER}`'s (transformers `generate`; at T > 0 its plain sampling) in the "
               f"same run; " if with_peer else "")
            + (f"x {peers.COMPILED} = the same over `{peers.COMPILED}`'s (`generate` with a static cache and "
               f"torch.compile); " if with_compiled else "")
            + f"tau = new tokens / target forward passes after the prefill."
            f"{kernels_note(result, with_eagle)}{warmup_note(result)}")


def benchmark_markdown(result: dict, stem: str) -> str:
    """The page of a benchmark result: the command that made it where the result names one ('command', and a
    'command_note' on how it ran, added when a run is published), the machine and settings, and per temperature
    the report's tables with each method's speedup over `baseline` and over PEER, the chart and `comparisons`."""
    m = result["machine"]
    command = []
    if result.get("command"):
        note = f", {result['command_note']}" if result.get("command_note") else ""
        command = [f"Command: `{result['command']}`{note}.", ""]
    bench = "MT-Bench" if result["bench"] == "mt_bench" else result["bench"]
    lines = [f"# {bench} benchmark, embedded default, {result['date']}", "", *command,
             f"Machine: {machine_line(m)}, device {result['device']}, "
             f"{result['dtype']}.", "", _settings_paragraph(result), ""]
    for tag, block in result["temperatures"].items():
        lines += [f"## Temperature {tag[1:]}", "", report.markdown(block["entries"], PEERS),
                  f"![chart]({stem}_{tag}.png)", ""] + [f"- {line}" for line in
                                                         comparisons(block["entries"], float(tag[1:]))] + [""]
    return "\n".join(lines)


def sweep_markdown(result: dict, name: str) -> str:
    m = result["machine"]
    temperatures = sorted({r["temperature"] for r in result["rows"]})
    turns = f"first {result['turns']} turn(s)" if result["turns"] else "all turns"
    lines = [f"# {name}", "", f"Machine: {machine_line(m)}, "
             f"{result['dtype']}. Questions: {result['bench']} {', '.join(map(str, result['questions']))}, "
             f"{turns}, at most {result['max_new_tokens']} new tokens, draft vocabulary "
             f"{result.get('draft_vocab') or 'full'}, {result.get('kernels', 'stock')} kernels. "
             "Cells: tau (tokens/s).", "",
             "| tree | drafter | verifier | " + " | ".join(f"T={t:g}" for t in temperatures) + " |",
             "|---|---|---|" + "---|" * len(temperatures)]
    keys = sorted({(r["tree"], r["drafter"], r["verifier"]) for r in result["rows"]},
                  key=lambda k: (list(dict.fromkeys(r["tree"] for r in result["rows"])).index(k[0]), k[1], k[2]))
    cell = {(r["tree"], r["drafter"], r["verifier"], r["temperature"]): r for r in result["rows"]}
    for key in keys:
        values = [cell.get(key + (t,)) for t in temperatures]
        lines.append(f"| {' | '.join(key)} | " + " | ".join(
            "-" if v is None else f"{v['tau']:.2f} ({v['tokens_per_s']:.1f})" for v in values) + " |")
    return "\n".join(lines) + "\n"
