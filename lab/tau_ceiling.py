"""How far the shipped head's one-step accuracy lets tau go: its tree walks replayed with the target's features.

At T = 0 a static tree accepts along the target's greedy answer only, so every
cycle can be replayed teacher-forced on that answer.  At draft depth d of the
cycle whose root is token x_s, the head reads (f_{s+d-2}, x_{s+d-1}) and ranks
the draft vocabulary; the walk goes on while the target's token x_{s+d} is the
head's k-th choice and the node has a k-th child.  Two replays:

- own features: at depth d >= 2 the head reads its own predicted features, as
  the decoder does (`training.unrolled_predictions`, pass d); this replay
  should give the decoder's own cycle counts, turn by turn (the check);
- the target's features: at every depth the head reads the target's true
  feature (pass 1 at every depth).  Its tau is what the head's one-step
  accuracy allows on this tree with none of the drift of reading its own
  predictions: how much any multi-step training (HASS, `--unroll`) could win;
- the target's features, and the target's token SHIFT places higher in the
  head's ranking everywhere (SHIFTS): what a head with a better one-step
  accuracy would allow, with none of the drift either.

The decoder first answers all 80 MT-Bench questions (both turns, T = 0,
eagle_default, float32 so its answers are the target's greedy ones, 128 new
tokens a turn, the goal's setting), a question a line appended to
WORK/decoded_HEAD_TREE.jsonl (a rerun continues).  Those answers do not
depend on the head, so `--answers-of FILE` replays another head on a file an
earlier run decoded, in minutes instead of a quarter of an hour (its replay
with its own features is then its decoder's tau, as the check shows; no
decoder row).  Writes evaluation/results/tau_ceiling[_HEAD]_<date>.md.

    .venv/bin/python lab/tau_ceiling.py [--questions N] [--head PATH] [--answers-of FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from tqdm import tqdm

import harness
from eagle_mdsd import bench, benchmarks, engine, jsonl, models, questions, report, training
from eagle_mdsd import head as head_module
from eagle_mdsd import tree as tree_module

MAX_NEW_TOKENS = 128  # the goal's setting
UNRANKED = 1 << 30  # the target's token is outside the draft vocabulary: no child holds it
SHIFTS = (1, 2, 3)


def decode(decoder, tokenizer, chosen: list[dict], path: Path) -> list[dict]:
    """Each question's turns answered by the decoder, a line per question appended to `path` (a rerun skips
    the questions already there)."""
    done = {row["question_id"] for row in jsonl.records(path)}
    jsonl.drop_cut_short_line(path)
    for question in tqdm([q for q in chosen if q["question_id"] not in done], desc="decoding", unit="question"):
        turns, texts = [], []
        for index in range(len(question["turns"])):
            prompt = bench.conversation_ids(tokenizer, question["turns"][: index + 1], texts)
            result = decoder.generate(prompt, MAX_NEW_TOKENS, 0.0)
            texts.append(tokenizer.decode(result.token_ids, skip_special_tokens=True).strip())
            turns.append({"prompt": prompt, "answer": result.token_ids, "accept_lengths": result.accept_lengths})
        with path.open("a") as handle:
            handle.write(json.dumps({"question_id": question["question_id"], "category": question["category"],
                                     "turns": turns}) + "\n")
    wanted = {q["question_id"] for q in chosen}
    return [row for row in jsonl.records(path) if row["question_id"] in wanted]


def ranks(draft_head, target, ids: torch.Tensor, rows: torch.Tensor, depths: int) -> torch.Tensor:
    """[depths, len(ids) - 1]: at depth d (row d - 1) and position i, the rank in the head's draft-vocabulary
    logits of token ids[i + 2] when the head reads (f_i, x_{i+1}) after d - 1 own predictions (pass d);
    UNRANKED outside the draft vocabulary.  The last position has no token to rank and stays UNRANKED.
    (The decoder ranks by q in float32: where q underflows to 0 it fills children in its own order, not by
    logits; a draft there is far from the target's token anyway.)"""
    column = torch.full((target.config.vocab_size,), -1, dtype=torch.long)
    column[rows] = torch.arange(len(rows))
    draft_logits = training.draft_vocab_lm_head(target.get_output_embeddings(), rows)
    out = torch.full((depths, len(ids) - 1), UNRANKED, dtype=torch.long)
    with torch.inference_mode():
        features = target.get_decoder()(ids[None]).last_hidden_state
        embedded = target.get_input_embeddings()(ids[1:])[None]
        passes = training.unrolled_predictions(draft_head, features[:, :-1], embedded, depths)
        wanted = column[ids[2:]]  # the token each position i < len - 2 must rank
        known = wanted >= 0
        for depth, predicted in enumerate(passes):
            logits = draft_logits(predicted[0, :-1]).float()
            own = logits.gather(1, wanted.clamp(min=0)[:, None])
            rank = (logits > own).sum(1)
            out[depth, :-1] = torch.where(known, rank, UNRANKED)
    return out


def walk(tree, rank, start: int, end: int, own_features: bool) -> list[int]:
    """Accept lengths (accepted drafts + 1) of the cycles of one turn whose answer fills ids[start:end]:
    rank[d - 1, i] decides depth d of the cycle whose root is at s (i = s + d - 2); with own_features False
    every depth uses rank[0] (the target's features)."""
    lengths, s = [], start
    while s < end - 1:
        node, accepted = 0, 0
        for depth in range(1, tree.max_depth + 1):
            if s + depth >= end:
                break
            k = int(rank[depth - 1 if own_features else 0, s + depth - 2])
            children = tree.children[node]
            if k >= len(children):
                break
            node, accepted = children[k], accepted + 1
        lengths.append(accepted + 1)
        s += accepted + 1
    return lengths


def replay(draft_head, target, topology, rows, decoded: list[dict]) -> dict:
    """Accept lengths per turn of the decoder and of the replays, and the depth-1 ranks of every answer
    position."""
    out = {"decoder": [], "own": [], "target": [], "depth1": [], "categories": [], "tokens": []}
    out |= {f"shift{j}": [] for j in SHIFTS}
    for row in tqdm(decoded, desc="replaying", unit="question"):
        for turn in row["turns"]:
            ids = torch.tensor(turn["prompt"] + turn["answer"])
            rank = ranks(draft_head, target, ids, rows, topology.max_depth)
            start = len(turn["prompt"])
            out["decoder"].append(turn["accept_lengths"])
            out["own"].append(walk(topology, rank, start, len(ids), True))
            out["target"].append(walk(topology, rank, start, len(ids), False))
            for j in SHIFTS:
                out[f"shift{j}"].append(walk(topology, (rank - j).clamp(min=0), start, len(ids), False))
            out["depth1"].append(rank[0, start - 1 : len(ids) - 2])
            out["categories"].append(row["category"])
            out["tokens"].append(len(turn["answer"]))
    return out


def tau(lengths: list[list[int]], tokens: list[int]) -> float:
    """New tokens / cycles, as everywhere (each turn's first token comes from the prefill and counts)."""
    return sum(tokens) / sum(len(turn) for turn in lengths)


def table(result: dict, first: torch.Tensor, depths: int, measured: bool) -> list[str]:
    """The walks' rows; `first`: the depth-1 ranks of every position (the shifted rows' top-1)."""
    lines = ["| walk | cycles | tau | " + " | ".join(f"d = {d}" for d in range(1, depths + 1)) + " |",
             "|---|---|---|" + "---|" * depths]
    names = {"decoder": "the decoder (measured)"} if measured else {}
    names |= {"own": "replay, the head's own features (as the decoder)",
              "target": "replay, the target's features at every depth (ceiling)"}
    for j in SHIFTS:
        names[f"shift{j}"] = (f"the same, the target's token {j} place{'s' * (j > 1)} higher in the head's ranking "
                              f"(top-1 {float((first <= j).float().mean()):.3f})")
    for key, name in names.items():
        flat = [n for turn in result[key] for n in turn]
        rates = report.acceptance_by_depth(flat) + [float("nan")] * depths
        lines.append(f"| {name} | {len(flat)} | {tau(result[key], result['tokens']):.3f} | "
                     + " | ".join(f"{r:.3f}" for r in rates[:depths]) + " |")
    return lines


def earlier_answers(path: Path, chosen: list[dict]) -> list[dict]:
    """The chosen questions' rows of a decoded file this script wrote; a one-line error for any other file."""
    wanted = {q["question_id"] for q in chosen}
    decoded = [row for row in jsonl.records(path) if row.get("question_id") in wanted]
    if any(not all({"prompt", "answer", "accept_lengths"} <= set(turn) for turn in row.get("turns", [{}]))
           for row in decoded):
        raise ValueError(f"--answers-of {path} is not a file of decoded answers from this script (its turns lack "
                         "prompt, answer and accept_lengths): pass a WORK/decoded_*.jsonl file")
    if len(decoded) < len(chosen):
        raise ValueError(f"--answers-of {path} holds {len(decoded)} of the {len(chosen)} questions: finish that run "
                         "first (a rerun of it continues)")
    return decoded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=80, help="the first N MT-Bench questions (default all 80)")
    parser.add_argument("--head", default=str(models.DEFAULT_HEAD), help="head folder (default: the shipped head)")
    parser.add_argument("--tree", default="eagle_default")
    parser.add_argument("--work", default="runs/tau_ceiling", help="folder for the decoded answers (resumable)")
    parser.add_argument("--answers-of", type=Path, help="replay on this earlier run's decoded answers (WORK/decoded_"
                        "*.jsonl) instead of decoding with --head")
    args = parser.parse_args()
    if not 1 <= args.questions <= 80:
        parser.error(f"--questions is {args.questions}: pass 1 to 80")
    if args.answers_of is not None and not args.answers_of.exists():
        parser.error(f"--answers-of {args.answers_of} does not exist: run this script once without it, which "
                     "writes its decoded answers under --work")
    try:
        page = run(args)
    except (ValueError, OSError) as error:  # bad trees, heads and answer files: one line, as the CLI's
        parser.error(str(error))
    print(page.read_text())


def run(args) -> Path:
    """Decode (or read --answers-of), replay, and write the page."""
    topology = tree_module.load(args.tree)
    chosen = questions.load("mt_bench")[: args.questions]
    measured = args.answers_of is None
    decoded = None if measured else earlier_answers(args.answers_of, chosen)
    target, tokenizer = models.load_target(None, torch.float32)
    draft_head = head_module.load_head(args.head, target)
    decoder = engine.Decoder(target, draft_head, topology, eos_token_ids=models.eos_token_ids(target, tokenizer),
                             draft_vocab="auto")
    rows = decoder.draft_model.rows if decoder.draft_model.rows is not None else torch.arange(target.config.vocab_size)
    if measured:
        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        decoded = decode(decoder, tokenizer, chosen, work / f"decoded_{Path(args.head).name}_{args.tree}.jsonl")
    result = replay(draft_head, target, topology, rows, decoded)
    tokens = sum(result["tokens"])
    same = sum(len(a) == len(b) for a, b in zip(result["decoder"], result["own"]))
    exact = sum(a[:-1] == b[:-1] for a, b in zip(result["decoder"], result["own"]))
    first = torch.cat(result["depth1"])
    shares = [f"top-{k} {float((first < k).float().mean()):.3f}" for k in (1, 2, 4, 8)]
    lines = table(result, first, topology.max_depth, measured)
    check = (f"The own-features replay gives the decoder's cycle count on {same} of {len(result['own'])} turns, and "
             f"its accept lengths cycle by cycle on {exact} (the last cycle left out: the decoder's may accept drafts "
             f"past the {MAX_NEW_TOKENS}th token, which it then drops, and the replay has none to walk)"
             if measured else f"Replayed on the greedy answers in `{args.answers_of.name}` (not decoded again)")
    lines += ["", f"{check}; {tokens} answer tokens in all (each turn's first comes from the prefill and counts, as in tau "
              "everywhere). Depth d: of the cycles that accepted d - 1 drafts, the share that accepted a d-th.", "",
              "Teacher-forced depth-1 rank of the target's token in the head's draft-vocabulary logits, over the "
              f"{len(first)} positions the walks can reach: " + ", ".join(shares) + ".", "",
              "Per category, tau (" + "decoder / " * measured + "own-features replay / target's features):", "",
              "| category | turns | " + "decoder | " * measured + "own | target's features |",
              "|---|---|---|---|" + "---|" * measured]
    for category in sorted(set(result["categories"])):
        picked = [i for i, c in enumerate(result["categories"]) if c == category]
        taus = [tau([result[key][i] for i in picked], [result["tokens"][i] for i in picked])
                for key in ("decoder",) * measured + ("own", "target")]
        lines.append(f"| {category} | {len(picked)} | " + " | ".join(f"{t:.3f}" for t in taus) + " |")
    return benchmarks.write_page(
        harness.RESULTS, "tau_ceiling" + ("" if Path(args.head) == models.DEFAULT_HEAD else f"_{Path(args.head).name}"),
        f"tau ceiling of the head's one-step accuracy ({args.tree}, T = 0)",
        f"Embedded default (SmolLM2-135M-Instruct), float32, head `{Path(args.head).name}`, tree {args.tree}, "
        f"draft vocabulary {len(rows)} tokens, the first {len(chosen)} MT-Bench questions, both turns, at most "
        f"{MAX_NEW_TOKENS} new tokens a turn. Command: `.venv/bin/python lab/tau_ceiling.py"
        + (f" --questions {args.questions}" if args.questions != 80 else "")
        + (f" --head {args.head}" if Path(args.head) != models.DEFAULT_HEAD else "")
        + (f" --tree {args.tree}" if args.tree != "eagle_default" else "")
        + (f" --answers-of {args.answers_of}" if not measured else "") + "`.", lines)


if __name__ == "__main__":
    main()
