"""Temperature-0 equivalence with transformers' greedy generate, on the embedded default or any target.

For each dtype, MT-Bench question (first turn) and tree, the engine's tokens
are compared with `generate(do_sample=False)` from the same prompt ids; the
row `hf_compiled` compares transformers' compiled static-cache `generate`
(peers.CompiledPeer) with it the same way.  Rows
are appended to a JSONL file as they finish, so an interrupted run resumes.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from tqdm import tqdm

from . import benchmarks, checkpoint, engine, head, jsonl, models, peers, questions, tree_specs, validate

BASELINE = "baseline"  # the engine's plain decoding, in place of a tree: where a difference enters
ALL_TREES = (BASELINE, "eagle_default", "binary_depth4", "quad_depth3", "chain4", "chain6", "eagle2", "opt_tree",
             "eagle_default+lookup", peers.COMPILED)
NOT_TREES = (BASELINE, peers.COMPILED)  # rows that decode without a tree


# A row of the results file, field by field: what a rerun reuses and the summary reads.
ROW_SCHEMA = {
    "max_new_tokens": validate.Field(validate.is_count, "a whole number of 0 or more"),
    "head": validate.Field(validate.is_text, "a text"),
    "dtype": validate.Field(validate.is_text, "a text"),
    "question_id": validate.Field(validate.is_int, "a whole number"),
    "tree": validate.Field(validate.is_text, "a text"),
    "identical": validate.Field(lambda v: isinstance(v, bool), "true or false"),
    "tokens": validate.Field(validate.is_count, "a whole number of 0 or more"),
    "first_difference": validate.Field(validate.is_count, "a whole number of 0 or more", nullable=True),
    "tau": validate.Field(validate.is_seconds, "a finite number of 0 or more"),
}


def read_rows(rows_file: Path) -> list[dict]:
    """The finished rows of a results file (none if it does not exist); a line that is not a row (an edited or
    damaged file) is a one-line error naming it."""
    return [row for _, row in jsonl.checked(rows_file, f"check-greedy file {rows_file}", "a check row",
                                            lambda row: validate.record_fault(row, ROW_SCHEMA),
                                            "delete that line, and a rerun writes its row again")]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (None when they are the same)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def made_with(max_new_tokens: int, head_spec: str, base_model: str | None) -> dict:
    """What a row's result depends on besides its dtype, question and tree: the target (a local one by its full
    path, as two folders may share a name) and the head's files (by checksum, as a folder may be rewritten)."""
    target = models.EMBEDDED if base_model in (None, models.EMBEDDED) else str(base_model)
    if Path(target).exists():
        target = str(Path(target).resolve())
    files = None if head_spec == "random" else checkpoint.head_checksum(checkpoint.head_folder(head_spec))
    return {"max_new_tokens": max_new_tokens, "head": head_spec, "base_model": target, "head_files": files}


def greedy_equivalence(rows_file: Path, question_count: int = 5, max_new_tokens: int = 128,
                       trees=ALL_TREES, dtypes=("float32", "bfloat16"), head_spec: str = "random",
                       base_model: str | None = None, device: str = "cpu", cuda_graphs: str = "auto",
                       kernels_choice: str = "auto") -> list[dict]:
    """base_model: a hub id, folder or .gguf file (models.load_target); None, the embedded default.
    kernels_choice: the engine's linear kernels (`engine.Decoder`); `generate` always runs the stock ones."""
    # bad names: now, before any model loads
    topologies = {name: None if name in NOT_TREES else tree_specs.load(name, device) for name in trees}
    torch_dtypes = {dtype: models.parse_dtype(dtype) for dtype in dtypes}
    done, made = {}, made_with(max_new_tokens, head_spec, base_model)  # rows of other settings: not reused
    jsonl.drop_cut_short_line(rows_file)
    for row in read_rows(rows_file):
        if all(row.get(key) == value for key, value in made.items()):
            done[(row["dtype"], row["question_id"], row["tree"])] = row
    chosen = questions.load("mt_bench")[:question_count]
    for dtype in dtypes:
        todo = [(q, t) for q in chosen for t in trees if (dtype, q["question_id"], t) not in done]
        if not todo:
            continue
        target, tokenizer = models.load_target(base_model, torch_dtypes[dtype], device)
        draft_head = head.random_head(target) if head_spec == "random" else head.load_head(head_spec, target)
        eos = models.eos_token_ids(target, tokenizer)
        references = {}
        compiled = peers.CompiledPeer(target, eos) if peers.COMPILED in trees else None
        reference_peer = peers.TransformersPeer(target, eos)
        for question, tree_name in tqdm(todo, desc=f"greedy check {dtype}"):
            prompt = models.chat_prompt_ids(tokenizer, question["turns"][0])
            if question["question_id"] not in references:  # greedy `generate`, stopping where the engine stops
                references[question["question_id"]] = reference_peer.generate(prompt, max_new_tokens, 0.0).token_ids
            reference = references[question["question_id"]]
            topology = topologies[tree_name]
            if tree_name == peers.COMPILED:
                result = compiled.generate(prompt, max_new_tokens, 0.0)
            else:
                decoder = engine.Decoder(target, draft_head, topology, eos_token_ids=eos, cuda_graphs=cuda_graphs,
                                         kernels_choice=kernels_choice)
                result = decoder.generate(prompt, max_new_tokens, 0.0,
                                          method="baseline" if topology is None else "eagle")
            row = made | {"dtype": dtype, "question_id": question["question_id"], "tree": tree_name,
                   "identical": result.token_ids == reference, "tokens": result.new_tokens,
                   "first_difference": first_difference(result.token_ids, reference), "tau": result.tau}
            rows_file.parent.mkdir(parents=True, exist_ok=True)  # a target that fails to load leaves nothing
            jsonl.append(rows_file, row)  # one write: a kill leaves the line whole or cut short
            done[(dtype, question["question_id"], tree_name)] = row
    return [row for row in done.values() if row["question_id"] in {q["question_id"] for q in chosen}]


def summary_markdown(rows: list[dict], max_new_tokens: int, head_spec: str, base_model: str | None = None,
                     device: str = "cpu") -> str:
    date = datetime.date.today().isoformat()
    machine = benchmarks.machine(device)
    target = ("Embedded SmolLM2-135M-Instruct" if base_model in (None, models.EMBEDDED)
              else f"Target {models.model_name(base_model)}")
    lines = [f"# Temperature 0: engine vs transformers greedy generate, {date}", "",
             f"Machine: {benchmarks.machine_line(machine)}, device {device}. {target}, "
             f"MT-Bench first turns, {max_new_tokens} new tokens, head: {head_spec}. "
             "A row is identical when every generated token id equals generate(do_sample=False)'s.", "",
             "| dtype | tree | questions | identical | first difference at token |", "|---|---|---|---|---|"]
    for dtype in sorted({r["dtype"] for r in rows}, reverse=True):
        for tree_name in dict.fromkeys(r["tree"] for r in rows):  # the trees in the order they ran
            group = [r for r in rows if r["dtype"] == dtype and r["tree"] == tree_name]
            if group:
                diffs = [str(r["first_difference"]) for r in group if not r["identical"]]
                lines.append(f"| {dtype} | {tree_name} | {len(group)} | {sum(r['identical'] for r in group)} | "
                             f"{', '.join(diffs) or '-'} |")
    return "\n".join(lines) + "\n"
