"""Timing of the core on this machine: one node's drafting and verification, and alpha*.

Results go to --out (default runs/bench-core) as JSON and a markdown table,
stamped with the date and the machine.  Timings are medians over repeated calls after a
warm-up; they are measurements, not assertions (the project's targets are in docs/benchmarks.md).
"""

from __future__ import annotations

import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from . import drafting, outputs, theory, verification

VOCABS = (32000, 152064)
DRAFT_COUNTS = tuple(range(2, 9))
ALPHA_SCHEMES = ("with_replacement", "without_replacement", "greedy", "topk")


def machine(device: str = "cpu") -> dict:
    """The CPU, torch's threads and versions; on a CUDA device ('cuda', 'cuda:1', 'auto') also the GPU's name."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    facts = {"cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__,
             "python": platform.python_version(), "platform": platform.platform()}
    if (str(device).startswith("cuda") or device == "auto") and torch.cuda.is_available():
        index = torch.device(device).index if str(device).startswith("cuda:") else 0
        facts["gpu"] = f"{torch.cuda.get_device_name(index)} x{torch.cuda.device_count()}"
    return facts


def machine_line(facts: dict) -> str:
    """'CPU, N torch threads, torch V' and the GPU where one timed the run."""
    gpu = f", GPU {facts['gpu']}" if facts.get("gpu") else ""
    return f"{facts['cpu']}, {facts['threads']} torch threads, torch {facts['torch']}{gpu}"


def write_page(folder: Path, stem: str, title: str, setup: str, table: list[str],
               facts: dict | None = None) -> Path:
    """folder/<stem>_<date>.md: the title with today's date, a line naming the machine (`facts`, default this
    one: machine()) followed by `setup`, and the markdown table (header rows first)."""
    facts, date = facts or machine(), datetime.date.today().isoformat()
    page = Path(folder) / f"{stem}_{date}.md"
    outputs.write_atomically(page, "\n".join([f"# {title}, {date}", "", f"Machine: {machine_line(facts)}. {setup}", "",
                                            *table, ""]))
    return page


def median_seconds(fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def node_distributions(vocab: int, seed: int = 0):
    """A target p and a correlated draft q shaped like LLM next-token distributions."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab, generator=gen) * 3.0
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits + torch.randn(vocab, generator=gen), -1)
    return p, q


def time_node(vocabs=VOCABS, draft_counts=DRAFT_COUNTS, dtype=torch.float32) -> list[dict]:
    rows = []
    gen = torch.Generator().manual_seed(1)
    for vocab in vocabs:
        p, q = (x.to(dtype) for x in node_distributions(vocab))
        repeats = 30 if vocab <= 50000 else 12
        for scheme_name, verifier_name in verification.pairs():
            scheme, verifier = drafting.get(scheme_name), verification.get(verifier_name)
            for n in draft_counts:
                if scheme.name == "spechub" and n != 2:
                    continue
                drafts = scheme.sample(q, n, gen)
                rows.append({
                    "vocab": vocab, "n": n, "scheme": scheme.name, "verifier": verifier.name,
                    "dtype": str(dtype).replace("torch.", ""),
                    "draft_ms": 1e3 * median_seconds(lambda: scheme.sample(q, n, gen), repeats),
                    "verify_ms": 1e3 * median_seconds(lambda: verifier.sample(p, q, drafts, gen), repeats),
                })
    return rows


def time_alpha(vocabs=VOCABS, draft_counts=DRAFT_COUNTS) -> list[dict]:
    rows = []
    for vocab in vocabs:
        p, q = (x.double() for x in node_distributions(vocab))
        for scheme in ALPHA_SCHEMES:
            for n in draft_counts:
                value = theory.optimal_acceptance(p, q, n, scheme)
                seconds = median_seconds(lambda: theory.optimal_acceptance(p, q, n, scheme), 3, warmup=1)
                rows.append({"vocab": vocab, "n": n, "scheme": scheme, "alpha_star": value, "seconds": seconds})
    return rows


def markdown(result: dict) -> str:
    lines = [f"# Core benchmark, {result['date']}", "",
             f"Machine: {result['machine']['cpu']}, {result['machine']['threads']} torch threads, "
             f"torch {result['machine']['torch']}, Python {result['machine']['python']}.", "",
             "One tree node, p and q in float32 (softmax of N(0, 9) logits, q with N(0, 1) noise added). "
             "`verify` = the verifier's plan plus drawing its output token; `draft` = drawing the n drafts. "
             "Medians in milliseconds.", ""]
    for vocab in sorted({r["vocab"] for r in result["node"]}):
        counts = sorted({r["n"] for r in result["node"] if r["vocab"] == vocab})
        lines += [f"## V = {vocab}: verify (draft) ms", "",
                  "| scheme | verifier | " + " | ".join(f"n={n}" for n in counts) + " |",
                  "|---|---|" + "---|" * len(counts)]
        pairs = dict.fromkeys((r["scheme"], r["verifier"]) for r in result["node"] if r["vocab"] == vocab)
        for scheme, verifier in pairs:
            cells = []
            for n in counts:
                row = next((r for r in result["node"] if (r["vocab"], r["n"], r["scheme"], r["verifier"])
                            == (vocab, n, scheme, verifier)), None)
                cells.append(f"{row['verify_ms']:.3f} ({row['draft_ms']:.3f})" if row else "-")
            lines.append(f"| {scheme} | {verifier} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## alpha*: seconds (value)", "", "float64, same p and q.", ""]
    for vocab in sorted({r["vocab"] for r in result["alpha"]}):
        counts = sorted({r["n"] for r in result["alpha"] if r["vocab"] == vocab})
        lines += [f"### V = {vocab}", "", "| scheme | " + " | ".join(f"n={n}" for n in counts) + " |",
                  "|---|" + "---|" * len(counts)]
        for scheme in ALPHA_SCHEMES:
            cells = [f"{r['seconds']:.4f} ({r['alpha_star']:.4f})" for n in counts for r in result["alpha"]
                     if (r["vocab"], r["n"], r["scheme"]) == (vocab, n, scheme)]
            lines.append(f"| {scheme} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Summary", ""] + [f"- {line}" for line in summary(result)] + [""]
    return "\n".join(lines)


def summary(result: dict) -> list[str]:
    """The slowest verification of one node at V = 32000 (a LLaMA-sized vocabulary), and alpha*'s time without
    replacement at V = 152064 (Qwen's), n = 4: the costs the tables above spread out."""
    worst = max((r for r in result["node"] if r["vocab"] == 32000), key=lambda r: r["verify_ms"], default=None)
    alpha = next((r for r in result["alpha"] if (r["vocab"], r["n"], r["scheme"])
                  == (152064, 4, "without_replacement")), None)
    out = []
    if worst:
        out.append(f"slowest verification of one node at V = 32000: {worst['scheme']}/{worst['verifier']} "
                   f"n={worst['n']}, {worst['verify_ms']:.3f} ms")
    if alpha:
        out.append(f"alpha* without replacement at V = 152064, n = 4: {alpha['seconds']:.3f} s")
    return out


def run_core_benchmark(out_dir: Path, vocabs=VOCABS, draft_counts=DRAFT_COUNTS) -> dict:
    """Time, then write out_dir/core_bench_DATE.{json,md}: a folder that cannot be made, or a page of that day
    already there, is a one-line error before the timing."""
    date = datetime.date.today().isoformat()
    stem = out_dir / f"core_bench_{date}"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise outputs.write_failed(out_dir, error) from None
    outputs.refuse_existing([stem.with_suffix(".json"), stem.with_suffix(".md")], "page",
                            "pass another --out, or move that page away")
    result = {"date": date, "machine": machine(),
              "node": time_node(vocabs, draft_counts), "alpha": time_alpha(vocabs, draft_counts)}
    result["summary"] = summary(result)
    outputs.write_atomically(stem.with_suffix(".json"), json.dumps(result, indent=1) + "\n")
    outputs.write_atomically(stem.with_suffix(".md"), markdown(result))
    return result
