"""What answers for each method: the runners a benchmark builds (EAGLE once per tree and pair) and their warm-up
to steady state before the clock starts."""

from __future__ import annotations

import time

from .. import bench, engine, kernels, models, peers, tree
from ..errors import UsageError
from .plans import METHODS


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


def kernels_used(choice: str, target, cuda_graphs: str = "auto") -> str:
    """'packed' or 'stock': what our decoders' linear layers run on for --kernels `choice`."""
    weight = target.get_output_embeddings().weight
    return "packed" if kernels.resolve(choice, weight, cuda_graphs == "compile") else "stock"


def benchmark_runners(plan, setups: list[dict], target, tokenizer, draft_head) -> tuple[dict, dict]:
    """({(sampled, label): (method, runner)}, {(sampled, label): the tree and pair an EAGLE label's rows
    record}) for `plan`'s methods: EAGLE once per tree (and pair) of `setups`, one decoder where both
    temperatures share the tree and pair, and entries sharing the sampling tree share its label (so it runs
    once at T > 0)."""
    runners, made_with, made = {}, {}, {}
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
                made_with[sampled, label] = {"tree": tree_name, **tree.file_record(topology), "drafter": pair[0],
                                             "verifier": pair[1]}
    return runners, made_with


def longest_turn(tokenizer, chosen: list[dict], max_new_tokens: int) -> int:
    """An upper bound on the tokens of any turn of `chosen`, prompt and answer: every earlier answer counted as
    max_new_tokens and a margin for re-tokenising its text.  hf_compiled allocates its static cache for it."""
    margin = 16
    return max(len(bench.conversation_ids(tokenizer, q["turns"], [""] * (len(q["turns"]) - 1)))
               + len(q["turns"]) * max_new_tokens + (len(q["turns"]) - 1) * margin for q in chosen)


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
