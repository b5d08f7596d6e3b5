"""The benchmarks users run: every method on MT-Bench, and sweeps over temperatures, trees and pairs.

`benchmark` answers the same questions with EAGLE, plain autoregressive
decoding in the same loop (`baseline`), transformers `generate` and prompt
lookup, question by question in turn (so slow drifts of a noisy machine hit
every method alike), into one answer file per method and temperature; then it
writes the report with the speedups over each of them.  `sweep` answers a
question set with every (tree, drafter, verifier, temperature) cell.  Both
resume from their answer files, and only when those were made the same way:
the answer folder's settings.json records the head (a checksum of its files),
dtype, trees, pair, draft vocabulary, seed and length, and a rerun with other
settings under the same name is refused, and so is a file whose rows record
other settings (`bench.check_answer_file`).  A fresh run's folder is made in
one `os.mkdir` before the model loads and its pages must not exist yet; a
resumed run rewrites its own page, which lists the questions its table holds.
Ctrl-C ends in one line with the `--resume` command that continues the run.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import re
import shlex
import time
from pathlib import Path

from tqdm import tqdm

from . import (bench, dynamic, engine, head, kernels, lookup, models, outputs, peers, questions, report,
               verification)
from .benchmarks import machine, machine_line
from .errors import Interrupted, UsageError, read_json

METHODS = ("eagle", "baseline") + peers.METHODS
PEER = "hf_generate"  # the page gives every method's tokens/s over transformers generate's, the usual reference,
PEERS = (PEER, peers.COMPILED)  # and over its compiled static-cache form's, the fast one
# EAGLE's pair at T > 0: sampled drafts beat deterministic top-k ones there (measured: docs/benchmarks.md).
SAMPLING_PAIR = "without_replacement/rrs_wo"
# EAGLE's static tree at T > 0: where every tree row costs target compute, as on a CPU, a chain of two sampled
# drafts outruns a wide tree at T = 1, though its tau is lower (measured: docs/benchmarks.md).  'same' keeps each
# --trees entry.
SAMPLING_TREE = "chain2"


def make_runner(method: str, target, tokenizer, draft_head=None, topology=None, drafter="topk",
                verifier="topk", draft_vocab: int | str | None = "auto", kernels_choice: str = "auto",
                cuda_graphs: str = "auto"):
    """What answers with `method`: an engine.Decoder (eagle, baseline; kernels_choice: kernels.CHOICES), a
    TransformersPeer or, for hf_compiled, a CompiledPeer (stock kernels always: transformers as users run it)."""
    eos = models.eos_token_ids(target, tokenizer)
    if method == peers.COMPILED:
        return peers.CompiledPeer(target, eos)
    if method in peers.METHODS:
        return peers.TransformersPeer(target, eos)
    if method not in METHODS:
        raise UsageError(f"unknown method {method!r}: use one of {', '.join(METHODS)}")
    if method == "baseline":
        return engine.Decoder(target, eos_token_ids=eos, kernels_choice=kernels_choice, cuda_graphs=cuda_graphs)
    return engine.Decoder(target, draft_head, topology, drafter, verifier, eos_token_ids=eos, draft_vocab=draft_vocab,
                          kernels_choice=kernels_choice, cuda_graphs=cuda_graphs)


def check_fits(topology, drafter: str, verifier: str) -> None:
    """One-line error unless the pair is lossless and can fill the tree (static or dynamic)."""
    verification.check_pair(drafter, verifier)
    topology.check_scheme(drafter)


def tree_label(topology) -> str:
    return topology.label


def tree_and_pair(entry: str, drafter: str, verifier: str) -> tuple[str, str, str]:
    """'TREE' or 'TREE@DRAFTER/VERIFIER' (a pair for this tree only) -> (tree, drafter, verifier)."""
    spec, at, pair = entry.partition("@")
    if not at:
        return spec, drafter, verifier
    own_drafter, slash, own_verifier = pair.partition("/")
    if not slash or not own_drafter or not own_verifier:
        raise UsageError(f"tree {entry!r}: write a tree's own pair as TREE@DRAFTER/VERIFIER, "
                         f"e.g. eagle2@greedy/greedy")
    return spec, own_drafter, own_verifier


def parse_sampling_pair(text: str, drafter: str, verifier: str) -> tuple[str, str]:
    """--sampling-pair 'DRAFTER/VERIFIER' (a lossless pair) or 'same' (drafter/verifier) -> (drafter, verifier)."""
    if text == "same":
        return drafter, verifier
    sampled_drafter, slash, sampled_verifier = text.partition("/")
    if not slash or not sampled_drafter or not sampled_verifier:
        raise UsageError(f"--sampling-pair {text!r}: write DRAFTER/VERIFIER, e.g. {SAMPLING_PAIR}, or 'same'")
    verification.check_pair(sampled_drafter, sampled_verifier)
    return sampled_drafter, sampled_verifier


def benchmark_setups(trees, drafter: str, verifier: str, sampled: tuple[str, str],
                     sampling_tree: str = "same") -> list[dict]:
    """{at T > 0: (label, topology, drafter, verifier)} per --trees entry: a tree's own pair (TREE@D/V) at
    every temperature; otherwise drafter/verifier at T = 0 and, on a static tree, `sampled` at T > 0 - on
    `sampling_tree` instead of the entry's tree unless that is 'same' (so at T > 0 the static entries share one
    run on it, and those with prompt-lookup drafts one on `sampling_tree`+lookupN; a dynamic tree grows its
    children with topk or greedy drafts, so it keeps its tree and drafter/verifier)."""
    setups = []
    for entry in trees:
        spec, own_drafter, own_verifier = tree_and_pair(entry, drafter, verifier)
        topology = dynamic.load(spec)
        check_fits(topology, own_drafter, own_verifier)
        own = "" if (own_drafter, own_verifier) == (drafter, verifier) else f"@{own_drafter}/{own_verifier}"
        label = tree_label(topology) + own
        own_run = (label, topology, own_drafter, own_verifier)
        setup = {False: own_run, True: own_run}
        grafted = topology.grafted
        if not own and topology.static:
            sampled_topology = topology
            if sampling_tree != "same":
                sampled_topology = dynamic.load(sampling_tree)
                if not sampled_topology.static or sampled_topology.grafted:
                    raise UsageError(f"--sampling-tree {sampling_tree}: give a static tree (a name, chainN or a "
                                     f"file), or 'same'")
                if grafted:  # TREE+lookupN samples on SAMPLING_TREE+lookupN
                    sampled_topology = lookup.LookupTree(sampled_topology, grafted)
            check_fits(sampled_topology, *sampled)
            setup[True] = (tree_label(sampled_topology), sampled_topology, *sampled)
        setups.append(setup)
    return setups


def sampled_note(result: dict) -> str:
    """'; at T > 0 (static trees) [tree S,] drafter D, verifier V' when the run sampled on another tree or with
    another pair (older runs recorded neither)."""
    pair, tree_name = result.get("sampling_pair"), result.get("sampling_tree", "same")
    if (pair is None or pair == f"{result['drafter']}/{result['verifier']}") and tree_name == "same":
        return ""
    sampled_drafter, sampled_verifier = (pair or f"{result['drafter']}/{result['verifier']}").split("/")
    tree_part = "" if tree_name == "same" else f"tree {tree_name}, "
    return f"; at T > 0 (static trees) {tree_part}drafter {sampled_drafter}, verifier {sampled_verifier}"


def kernels_used(choice: str, target) -> str:
    """'packed' or 'stock': what our decoders' linear layers run on for --kernels `choice`."""
    return "packed" if kernels.resolve(choice, target.get_output_embeddings().weight) else "stock"


def kernels_note(result: dict) -> str:
    """The report's sentence on kernels (older runs recorded none: stock)."""
    if result.get("kernels", "stock") == "stock":
        return ""
    return (" EAGLE and baseline ran their linear layers on prepacked oneDNN bf16 weights (--kernels packed: "
            "faster; the stock kernels' outputs on decoding-sized inputs, a long prefill can round differently), "
            "the transformers peers on stock kernels, as users run them.")


def _file_safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def spread(chosen: list[dict], count: int | None) -> list[dict]:
    """`count` questions taken round-robin over the categories (all when count is None), by id."""
    if count is None or count >= len(chosen):
        return chosen
    by_category: dict[str, list[dict]] = {}
    for question in chosen:
        by_category.setdefault(question["category"], []).append(question)
    picked, rank = [], 0
    while len(picked) < count:
        picked += [group[rank] for group in by_category.values() if rank < len(group)][: count - len(picked)]
        rank += 1
    return sorted(picked, key=lambda q: q["question_id"])


def head_checksum(folder: Path) -> str:
    """sha256 over a head folder's files (names and bytes), so answers name the head that made them."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).iterdir() if p.is_file()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def check_settings(folder: Path, settings: dict) -> None:
    """Record how folder's answers are made (settings.json), or refuse to resume answers made otherwise."""
    record = Path(folder) / "settings.json"
    if record.exists():
        made = _read_settings(record)
        changed = [f"{key} {made.get(key)} -> {value}" for key, value in settings.items() if made.get(key) != value]
        if changed:
            raise UsageError(f"{folder} holds answers made with other settings ({'; '.join(changed)}): pass "
                             f"another --name, or delete the folder to start over")
        return
    if any(Path(folder).glob("*.jsonl")):
        raise UsageError(f"{folder} holds answers without a settings.json, made with unknown settings: pass "
                         f"another --name, or delete the folder to start over")
    _write_settings(folder, settings)


def _read_settings(record: Path) -> dict:
    """A run's settings.json; a broken one is a one-line error naming it."""
    made = read_json(record, "run settings", "restore it from the run's copy, or delete the run folder to start "
                                             "over", kind=dict)
    machine_record = made.get("machine")
    if machine_record is not None and not (isinstance(machine_record, dict)
                                           and {"cpu", "threads", "torch"} <= set(machine_record)
                                           and isinstance(machine_record["cpu"], str)):
        raise UsageError(f"run settings {record} has a 'machine' that is no record of a machine: restore it from "
                         f"the run's copy, or delete the run folder to start over")
    return made


def _write_settings(folder: Path, settings: dict) -> None:
    """folder/settings.json, written whole or not at all."""
    outputs.write_atomically(Path(folder) / "settings.json", json.dumps(settings, indent=1) + "\n")


def timing_machine(folder: Path, answer_files, chosen: list[dict], device: str = "cpu") -> dict:
    """The machine a folder's answers are timed on: recorded in its settings.json by the first run, and named
    by every report of them, whichever machine rewrites the report.  Adding answers on another machine would
    mix two machines' timings in one table: a one-line error (when every answer file already holds every
    chosen question, the run only reports)."""
    wanted = {q["question_id"] for q in chosen}
    finished = all(wanted <= bench.finished_ids(Path(f)) for f in answer_files)
    record = Path(folder) / "settings.json"
    settings = _read_settings(record) if record.exists() else {}
    here, made = machine(device), settings.get("machine")
    if made is None:
        settings["machine"] = made = here
        _write_settings(folder, settings)
    elif (made["cpu"], made.get("gpu")) != (here["cpu"], here.get("gpu")) and not finished:
        raise UsageError(f"{folder} holds answers timed on {machine_line(made)} and this machine is "
                         f"{machine_line(here)}: finish them there, or pass another --name")
    return made


def longest_turn(tokenizer, chosen: list[dict], max_new_tokens: int) -> int:
    """An upper bound on the tokens of any turn of `chosen`, prompt and answer: every earlier answer counted as
    max_new_tokens and a margin for re-tokenising its text.  hf_compiled allocates its static cache for it."""
    margin = 16
    return max(len(bench.conversation_ids(tokenizer, q["turns"], [""] * (len(q["turns"]) - 1)))
               + len(q["turns"]) * max_new_tokens + (len(q["turns"]) - 1) * margin for q in chosen)


# Answered in full before the timed questions where the benchmark leaves no question of its set out.
SPARE_QUESTION = {"question_id": -1, "category": "warm-up", "turns": [
    "Write a long, detailed travel story about a week spent walking along a coast, day by day.",
    "Now rewrite the story as a letter to a friend, keeping every day in it."]}


def warmup_question(all_questions: list[dict], chosen: list[dict]) -> dict:
    """The question every method answers in full before the timed ones: the first of the set left out of
    `chosen`, so that no timed answer is one a method has already given."""
    taken = {q["question_id"] for q in chosen}
    return next((q for q in all_questions if q["question_id"] not in taken), SPARE_QUESTION)


def warm_up(runners: dict, files, tokenizer, question: dict, plan, cache_tokens: int) -> dict:
    """Steady state before the clock: every compiled peer compiles and allocates for `cache_tokens` (its seconds
    under 'compile_s'), then every (temperature, label) of `files` answers `question` in full, all its turns at
    the benchmark's length (seconds under 'warmup_s', keyed 'LABEL T=t').  Nothing here is timed or written."""
    compile_s, warmup_s = {}, {}
    for t, label in files:
        method, runner = runners[t > 0, label]
        if isinstance(runner, peers.CompiledPeer) and label not in compile_s:
            compile_s[label] = runner.prepare(cache_tokens)
    for t, label in files:
        method, runner = runners[t > 0, label]
        start = time.perf_counter()
        bench.answer(runner, tokenizer, question, bench.Settings(method, plan.max_new_tokens, t, plan.seed))
        warmup_s[f"{label} T={t:g}"] = time.perf_counter() - start
    return {"question": question["question_id"], "compile_s": compile_s, "warmup_s": warmup_s}


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


def _temperature_tag(temperature: float) -> str:
    return f"t{temperature:g}"


@dataclasses.dataclass(frozen=True)
class BenchmarkPlan:
    """What `run_benchmark` runs: `count` questions of `bench_name` spread over its categories (None: all), each
    method at each temperature.  EAGLE drafts with drafter/verifier at T = 0; at T > 0 a static tree without its
    own pair (TREE@D/V) uses `sampling_pair` ('D/V', or 'same' for drafter/verifier) on `sampling_tree` (or
    'same': on itself).  kernels_choice: what EAGLE and baseline run their linear layers on (kernels.CHOICES); the
    transformers peers keep stock kernels.  name: the answer folder and report stem (default
    benchmark_<date>_<dtype>)."""

    bench_name: str = "mt_bench"
    count: int | None = 8
    temperatures: tuple = (0.0, 1.0)
    methods: tuple = METHODS
    trees: tuple = ("eagle_default",)
    drafter: str = "topk"
    verifier: str = "topk"
    sampling_pair: str = SAMPLING_PAIR
    sampling_tree: str = SAMPLING_TREE
    draft_vocab: int | str | None = "auto"
    kernels_choice: str = "auto"
    cuda_graphs: str = "auto"
    dtype: str = "bfloat16"
    device: str = "cpu"
    max_new_tokens: int = 128
    seed: int = 0
    name: str | None = None
    new_run: bool = False  # a fresh run: its folder is made here (or refused) and its pages must not exist

    def __post_init__(self):
        for method in self.methods:
            if method not in METHODS:
                raise UsageError(f"unknown method {method!r}: use one of {', '.join(METHODS)}")


def run_benchmark(out: Path, answers: Path, plan: BenchmarkPlan = BenchmarkPlan(), process: tuple[int, int] = (0, 1),
                  barrier=lambda: None, command: str | None = None) -> dict | None:
    """`answer_and_report`; Ctrl-C once the run's folder is there ends in one line (`Interrupted`) saying how
    many questions every method answered and the command that continues the run."""
    progress = {}  # set as the run goes: its folder, the questions this process answers, how many are done
    try:
        return answer_and_report(out, answers, plan, process, barrier, command, progress)
    except KeyboardInterrupt:
        if "folder" not in progress:
            raise  # nothing of the run is written yet
        done, mine = progress["answered"], progress["questions"]
        raise Interrupted(f"{done} of {mine} questions are answered by every method in {progress['folder']}, "
                          f"{mine - done} are not (answers under way are dropped whole) and the page is not "
                          f"written; continue with "
                          f"`{resume_command(command, progress['folder'].name, 'benchmark')}`") from None


def answer_and_report(out: Path, answers: Path, plan: BenchmarkPlan = BenchmarkPlan(),
                      process: tuple[int, int] = (0, 1), barrier=lambda: None, command: str | None = None,
                      progress: dict | None = None) -> dict | None:
    """Answer into answers/NAME/, then report into out/NAME.{json,md,_t*.png} (naming `command`, the command
    line that ran it, when given); a rerun with the same name resumes, and Ctrl-C names the command that does.
    process = (index, count) of processes started together (accelerate launch, torchrun): each answers
    every count-th question into shard files, `barrier` waits for all of them, and the first merges the shards
    and reports (the others return None)."""
    index, count = process
    progress = {} if progress is None else progress
    sampled_drafter, sampled_verifier = parse_sampling_pair(plan.sampling_pair, plan.drafter, plan.verifier)
    setups = benchmark_setups(plan.trees, plan.drafter, plan.verifier, (sampled_drafter, sampled_verifier),
                              plan.sampling_tree)
    all_questions = questions.load(plan.bench_name)
    chosen = spread(all_questions, plan.count)
    date = datetime.date.today().isoformat()
    name = plan.name or f"benchmark_{date}_{plan.dtype}"
    stem = Path(out) / name
    if plan.new_run and index == 0:  # before the model loads: a page is never overwritten, a folder never shared
        outputs.refuse_existing([stem.with_suffix(".md"), stem.with_suffix(".json")]
                                + [stem.with_name(f"{name}_{_temperature_tag(t)}.png") for t in plan.temperatures],
                                "page", "pass another --name, or another --out")
        outputs.new_run_folder(Path(answers) / name, f"pass another --name, or --resume {name} to continue it")
    elif (Path(answers) / name / "settings.json").exists():
        _read_settings(Path(answers) / name / "settings.json")  # a broken record before the model loads
    progress.update(folder=Path(answers) / name, questions=len(chosen[index::count]), answered=0)
    target, tokenizer = models.load_target(None, models.parse_dtype(plan.dtype), plan.device)
    used_kernels = kernels_used(plan.kernels_choice, target)
    draft_head = head.load_head(models.DEFAULT_HEAD, target) if "eagle" in plan.methods else None
    runners = {}  # (sampled, label) -> (method, runner): EAGLE once per tree (and pair)
    made_with = {}  # (sampled, label) -> the tree and pair its rows record
    made = {}  # one decoder when both temperatures share the tree and pair
    for method in plan.methods:
        if method != "eagle":
            runner = make_runner(method, target, tokenizer, kernels_choice=plan.kernels_choice,
                                 cuda_graphs=plan.cuda_graphs)
            runners[False, method] = runners[True, method] = (method, runner)
            continue
        for setup in setups:
            for sampled, (tree_name, topology, *pair) in setup.items():
                key = (tree_name, *pair)
                if key not in made:
                    made[key] = make_runner(method, target, tokenizer, draft_head, topology, *pair,
                                            plan.draft_vocab, plan.kernels_choice, plan.cuda_graphs)
                label = "eagle" if len(setups) == 1 else f"eagle[{tree_name}]"
                runners[sampled, label] = (method, made[key])
                made_with[sampled, label] = {"tree": tree_name, "drafter": pair[0], "verifier": pair[1]}
                # (entries sharing the sampling tree share its label, so it runs once at T > 0)
    draft_vocab = engine.resolve_draft_vocab(draft_head, plan.draft_vocab)
    checksum = head_checksum(models.DEFAULT_HEAD) if draft_head is not None else None
    if index > 0:
        barrier()  # the first process records the settings and the machine before the others read them
    check_settings(Path(answers) / name, {
        "head": checksum, "dtype": plan.dtype,
        "bench": plan.bench_name, "max_new_tokens": plan.max_new_tokens, "seed": plan.seed,
        "trees": [s[False][0] for s in setups], "drafter": plan.drafter, "verifier": plan.verifier,
        "draft_vocab": draft_vocab, "sampling_pair": f"{sampled_drafter}/{sampled_verifier}", "kernels": used_kernels,
        **({} if plan.sampling_tree == "same" else {"sampling_tree": plan.sampling_tree})})  # older runs recorded none
    files = {(t, label): Path(answers) / name / _file_safe(
        f"{plan.bench_name}-{models.EMBEDDED_NAME}-{label}-{_temperature_tag(t)}.jsonl")
        for t in plan.temperatures for sampled, label in runners if sampled == (t > 0)}
    context = {"dtype": str(models.parse_dtype(plan.dtype)).removeprefix("torch."), "base_model": models.EMBEDDED}
    eagle = {key: value | {"draft_vocab": draft_vocab, "head": checksum} for key, value in made_with.items()}
    row_settings = {(t, label): bench.Settings(runners[t > 0, label][0], plan.max_new_tokens, t, plan.seed,
                                               context=tuple((context | eagle.get((t > 0, label), {})).items()))
                    for t, label in files}
    for (t, label), answer_file in files.items():  # before any answer: a file of other settings is refused
        bench.check_answer_file(answer_file, row_settings[t, label], chosen, vouched=True)
    timed_on = timing_machine(Path(answers) / name, files.values(), chosen, plan.device)
    if index == 0:
        barrier()
    spare = warmup_question(all_questions, chosen)
    wanted = {q["question_id"] for q in chosen[index::count]}
    warmup = None  # (a run whose answers are all there only reports)
    if any(not wanted <= bench.finished_ids(answer_file) for answer_file in files.values()):
        warmup = warm_up(runners, files, tokenizer, spare, plan,
                         longest_turn(tokenizer, chosen + [spare], plan.max_new_tokens))
    for question in tqdm(chosen[index::count], desc=f"{plan.bench_name} questions, each into {len(files)} answer "
                         f"files", disable=index > 0):
        for (t, label), answer_file in files.items():
            method, runner = runners[t > 0, label]
            bench.run(runner, tokenizer, [question], answer_file, f"{models.EMBEDDED_NAME}-{label}",
                      row_settings[t, label], warmup=False, progress=False, process=process, share_out=False,
                      vouched=True)
        progress["answered"] += 1
    barrier()
    if index > 0:
        return None
    for answer_file in files.values():
        bench.merge_shards(answer_file)
    held = sorted(set().union(*(bench.finished_ids(f) for f in files.values())))  # what the tables hold
    result = {"name": name, "date": date, "machine": timed_on, **({"command": command} if command else {}),
              "bench": plan.bench_name, "warmup": warmup,
              "questions": held,
              "dtype": plan.dtype, "device": plan.device, "max_new_tokens": plan.max_new_tokens,
              "trees": [setup[False][0] for setup in setups],
              "drafter": plan.drafter, "verifier": plan.verifier,
              "sampling_pair": f"{sampled_drafter}/{sampled_verifier}", "sampling_tree": plan.sampling_tree,
              "draft_vocab": draft_vocab, "kernels": used_kernels,
              "temperatures": {}}
    for t in plan.temperatures:
        baseline = files[t, "baseline"] if "baseline" in plan.methods else None
        labels = [label for sampled, label in runners if sampled == (t > 0) and (t, label) in files]
        entries = report.compare([files[t, label] for label in labels], baseline, labels=labels)
        report.bar_chart(entries, stem.with_name(f"{stem.name}_{_temperature_tag(t)}.png"), baseline)
        result["temperatures"][_temperature_tag(t)] = {"entries": entries}
    outputs.write_atomically(stem.with_suffix(".json"), json.dumps(result, indent=1))
    outputs.write_atomically(stem.with_suffix(".md"), benchmark_markdown(result, stem.name))
    return result


def resume_command(command: str | None, name: str, kind: str) -> str:
    """The command line that continues run `name`: `command` with --name NAME turned into --resume NAME (one
    that already resumes stays as it is); without a command, the bare `eagle-mdsd KIND --resume NAME`."""
    if not command:
        return f"eagle-mdsd {kind} --resume {name} (with the options of the interrupted run)"
    words, kept, skip = shlex.split(command), [], False
    if any(word == "--resume" or word.startswith("--resume=") for word in words):
        return command
    for word in words:
        if skip:
            skip = False
        elif word == "--name":
            skip = True
        elif not word.startswith("--name="):
            kept.append(word)
    return shlex.join(kept + ["--resume", name])


def comparisons(entries: list[dict], temperature: float) -> list[str]:
    """Measured ratios of one temperature's tokens/s that the table (with its column over PEER) does not give:
    each EAGLE row over prompt lookup, each dynamic tree over the static default, and each EAGLE tree's time a
    cycle (tokens/s = tau / seconds a cycle, so the tau a speed asks for follows from it: docs/benchmarks.md)."""
    speed = {e["label"]: e["categories"]["all"]["tokens_per_s"] for e in entries}
    eagles = [label for label in speed if label == "eagle" or label.startswith("eagle[")]
    lines = [f"{label} / prompt_lookup at T={temperature:g}: {speed[label]:.1f} / {speed['prompt_lookup']:.1f} "
             f"tokens/s = {speed[label] / speed['prompt_lookup']:.2f}x" for label in eagles if "prompt_lookup" in speed]
    static = "eagle[eagle_default]"
    lines += [f"{label} / {static} at T={temperature:g}: {speed[label] / speed[static]:.2f}x" for label in eagles
              if label != static and static in speed and label[6:].split(":")[0] in dynamic.NAMES]
    for entry in entries:
        all_ = entry["categories"]["all"]
        if entry["label"] in eagles and all_.get("cycles"):
            lines.append(f"{entry['label']} at T={temperature:g}: {1000 * all_['wall_time_s'] / all_['cycles']:.1f} "
                         f"ms a cycle (wall time / cycles, prefill included), tau {all_['tau']:.2f}")
    return lines


def benchmark_markdown(result: dict, stem: str) -> str:
    """The page of a `run_benchmark` result: the command that made it where the result names one ('command', and
    a 'command_note' on how it ran, added when a run is published), the machine and settings, and per temperature
    the report's tables with each method's speedup over `baseline` and over PEER, the chart and `comparisons`."""
    m = result["machine"]
    labels = {e["label"] for block in result["temperatures"].values() for e in block["entries"]}
    with_peer, with_compiled = PEER in labels, peers.COMPILED in labels
    command = []
    if result.get("command"):
        note = f", {result['command_note']}" if result.get("command_note") else ""
        command = [f"Command: `{result['command']}`{note}.", ""]
    lines = [f"# MT-Bench benchmark, embedded default, {result['date']}", "", *command,
             f"Machine: {machine_line(m)}, device {result['device']}, "
             f"{result['dtype']}.", "",
             f"Questions: {result['bench']} {', '.join(map(str, result['questions']))} (both turns), "
             f"at most {result['max_new_tokens']} new tokens per turn; EAGLE: shipped head, tree(s) "
             f"{', '.join(result['trees'])}, "
             f"drafter {result['drafter']}, verifier {result['verifier']}"
             f"{sampled_note(result)} (TREE@D/V: that tree's own pair), "
             f"draft vocabulary "
             f"{result.get('draft_vocab') or 'full'}. Methods ran question by question in turn "
             f"in one process. Speedup = tokens/s over `baseline` (plain autoregressive decoding in the same loop) "
             f"on the same questions; "
             + (f"x {PEER} = tokens/s over `{PEER}`'s (transformers `generate`; at T > 0 its plain sampling) in the "
                f"same run; " if with_peer else "")
             + (f"x {peers.COMPILED} = the same over `{peers.COMPILED}`'s (`generate` with a static cache and "
                f"torch.compile); " if with_compiled else "")
             + f"tau = new tokens / target forward passes after the prefill."
             f"{kernels_note(result)}{warmup_note(result)}", ""]
    for tag, block in result["temperatures"].items():
        lines += [f"## Temperature {tag[1:]}", "", report.markdown(block["entries"], PEERS),
                  f"![chart]({stem}_{tag}.png)", ""] + [f"- {line}" for line in
                                                         comparisons(block["entries"], float(tag[1:]))] + [""]
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """The cells `sweep` runs: every tree x (drafter, verifier) pair (None: all lossless pairs) x temperature that
    fits, on `count` questions of `bench_name` (their first `turns` turns; None: all), EAGLE only.  name: the
    answer folder and page stem (default sweep_<date>_<dtype>)."""

    trees: tuple = ("chain4", "binary_depth4", "quad_depth3", "eagle_default")
    temperatures: tuple = (0.0, 0.1, 0.6, 1.0)
    pairs: tuple | None = None
    bench_name: str = "mt_bench"
    count: int = 8
    turns: int | None = 1
    max_new_tokens: int = 64
    draft_vocab: int | str | None = "auto"
    kernels_choice: str = "auto"
    cuda_graphs: str = "auto"
    dtype: str = "bfloat16"
    device: str = "cpu"
    seed: int = 0
    name: str | None = None
    new_run: bool = False  # a fresh run: its folder is made here (or refused) and its page must not exist


def sweep(out: Path, answers: Path, plan: SweepPlan = SweepPlan(), command: str | None = None) -> Path:
    """EAGLE with every (tree, pair, temperature) of `plan` that fits; tau and tokens/s per cell into
    out/<name>.{md,json}; Ctrl-C names the command (`command`, the one that ran it, made to resume) that
    continues."""
    pairs = plan.pairs or verification.pairs()
    topologies = {tree_label(topology): topology for topology in map(dynamic.load, plan.trees)}
    for drafter, verifier in pairs:
        verification.check_pair(drafter, verifier)
    cells = []
    for t in plan.temperatures:
        for tree_name, topology in topologies.items():
            for drafter, verifier in pairs:
                try:
                    check_fits(topology, drafter, verifier)
                except ValueError:
                    continue  # e.g. spechub needs two children at every node; dynamic trees take topk only
                cells.append((t, tree_name, drafter, verifier))
    if not cells:
        raise UsageError(f"no pair of --pairs fits any tree of --trees ({', '.join(topologies)}): e.g. spechub needs "
                         f"two children at every node, opt_tree topk drafts")
    chosen = spread(questions.load(plan.bench_name), plan.count)
    name = plan.name or f"sweep_{datetime.date.today().isoformat()}_{plan.dtype}"
    out = Path(out)
    if plan.new_run:  # before the model loads: a page is never overwritten, a folder never shared
        outputs.refuse_existing([out / f"{name}.md", out / f"{name}.json"], "page",
                                "pass another --name, or another --out")
        outputs.new_run_folder(Path(answers) / name, f"pass another --name, or --resume {name} to continue it")
    elif (Path(answers) / name / "settings.json").exists():
        _read_settings(Path(answers) / name / "settings.json")  # a broken record before the model loads
    rows = []
    try:  # from here on, the run's folder is there (empty while the model loads) and resumes
        target, tokenizer = models.load_target(None, models.parse_dtype(plan.dtype), plan.device)
        draft_head = head.load_head(models.DEFAULT_HEAD, target)
        draft_vocab = engine.resolve_draft_vocab(draft_head, plan.draft_vocab)
        context = {"dtype": str(models.parse_dtype(plan.dtype)).removeprefix("torch."), "base_model": models.EMBEDDED,
                   "draft_vocab": draft_vocab, "head": head_checksum(models.DEFAULT_HEAD)}
        files = {cell: Path(answers) / name / _file_safe(f"{tree}-{drafter}-{verifier}-{_temperature_tag(t)}.jsonl")
                 for cell in cells for t, tree, drafter, verifier in [cell]}
        row_settings = {cell: bench.Settings("eagle", plan.max_new_tokens, t, plan.seed, turns=plan.turns,
                                             context=tuple((context | {"tree": tree, "drafter": drafter,
                                                                       "verifier": verifier}).items()))
                        for cell in cells for t, tree, drafter, verifier in [cell]}
        for cell, answer_file in files.items():  # before any answer: a file of other settings is refused
            bench.check_answer_file(answer_file, row_settings[cell], chosen)
        timed_on = timing_machine(Path(answers) / name, files.values(), chosen, plan.device)
        for t, tree_name, drafter, verifier in tqdm(cells, desc="sweep cells"):
            runner = make_runner("eagle", target, tokenizer, draft_head, topologies[tree_name], drafter, verifier,
                                 plan.draft_vocab, plan.kernels_choice, plan.cuda_graphs)
            answer_file = files[t, tree_name, drafter, verifier]
            bench.run(runner, tokenizer, chosen, answer_file, f"{models.EMBEDDED_NAME}-eagle",
                      row_settings[t, tree_name, drafter, verifier], progress=False)
            totals = report.summarise(answer_file)["all"]
            rows.append({"temperature": t, "tree": tree_name, "drafter": drafter, "verifier": verifier,
                         "tau": totals["tau"], "tokens_per_s": totals["tokens_per_s"],
                         "new_tokens": totals["new_tokens"]})
    except KeyboardInterrupt:
        raise Interrupted(f"{len(rows)} of {len(cells)} cells are answered in {Path(answers) / name}, "
                          f"{len(cells) - len(rows)} are not (an answer under way is dropped whole) and the page is "
                          f"not written; continue with `{resume_command(command, name, 'sweep')}`") from None
    held = sorted(set().union(*(bench.finished_ids(f) for f in files.values())))  # what the table holds
    result = {"machine": timed_on, "dtype": plan.dtype, "bench": plan.bench_name, "draft_vocab": draft_vocab,
              "kernels": kernels_used(plan.kernels_choice, target),
              "questions": held, "turns": plan.turns,
              "max_new_tokens": plan.max_new_tokens, "rows": rows}
    outputs.write_atomically(out / f"{name}.json", json.dumps(result, indent=1))
    outputs.write_atomically(out / f"{name}.md", sweep_markdown(result, name))
    return out / f"{name}.md"


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
