"""Answer files: valid, resumable, and the summary recomputes from them."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from eagle_mdsd import (bench, benchmarks, checkpoint, cli, engine, errors, head, kernels, models, peers, questions,
                        report, tree)
from eagle_mdsd.benchmark import answering, pages, plans, records, run as benchmark_run, runners, selection, sweep
from eagle_mdsd.errors import UsageError

from tiny import embedded_tokenizer, tiny_target


@pytest.fixture(scope="module")
def small_chat_model():
    """The embedded model's tokenizer and chat template on a tiny random Llama of the same vocabulary."""
    tokenizer = embedded_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048)
    target = LlamaForCausalLM(config).eval()
    return target, tokenizer


@pytest.mark.parametrize("method", ["eagle", "baseline"])
def test_answer_files_are_valid_and_resume(tmp_path, small_chat_model, method):
    target, tokenizer = small_chat_model
    decoder = engine.Decoder(target, head.random_head(target), tree.load("chain4"))
    chosen = questions.load("mt_bench")[:3]
    answer_file = tmp_path / "answers.jsonl"
    settings = bench.Settings(method, max_new_tokens=6)
    bench.run(decoder, tokenizer, chosen[:2], answer_file, "tiny", settings)
    first = answer_file.read_text().splitlines()
    bench.run(decoder, tokenizer, chosen, answer_file, "tiny", settings)  # resumes: only question 3
    lines = answer_file.read_text().splitlines()
    assert lines[:2] == first and len(lines) == 3
    rows = [json.loads(line) for line in lines]
    assert [r["question_id"] for r in rows] == [81, 82, 83]
    for row in rows:
        assert {"question_id", "answer_id", "model_id", "choices", "tstamp"} <= set(row)
        choice = row["choices"][0]
        assert len(choice["turns"]) == 2 == len(choice["idxs"]) == len(choice["new_tokens"])
        # the token sampled after the prefill plus every cycle's tokens, cut at max_new_tokens
        assert all(isinstance(n, int) for n in choice["accept_lengths"])  # one flat list, as Spec-Bench writes
        assert sum(choice["idxs"]) == len(choice["accept_lengths"])
        assert all(n == min(1 + sum(a), 6) for a, n in zip(bench.turn_lengths(choice), choice["new_tokens"]))
    summary = report.summarise(answer_file)
    tokens = sum(sum(r["choices"][0]["new_tokens"]) for r in rows)
    cycles = sum(sum(r["choices"][0]["idxs"]) for r in rows)
    assert summary["all"]["new_tokens"] == tokens and summary["all"]["tau"] == pytest.approx(tokens / cycles)
    assert summary["writing"]["questions"] == 3


def test_answer_files_read_as_spec_bench_reads_them(tmp_path, small_chat_model):
    """Spec-Bench's speed.py, from its format: per question, tokens / seconds of choices[0] (all turns); speed is
    the mean of those rates and speedup the ratio of the means; accept_lengths is one flat list of numbers per
    choice, averaged over every cycle.  EAGLE's speed.py reads new_tokens, wall_time and turns the same way."""
    import numpy

    target, tokenizer = small_chat_model
    chosen = questions.load("mt_bench")[:3]
    eos = models.eos_token_ids(target, tokenizer)
    runners = {"eagle": engine.Decoder(target, head.random_head(target), tree.load("chain4"), eos_token_ids=eos),
               "baseline": engine.Decoder(target, eos_token_ids=eos), "hf_generate": peers.TransformersPeer(target, eos),
               "prompt_lookup": peers.TransformersPeer(target, eos)}
    files = {}
    for method, runner in runners.items():
        files[method] = tmp_path / f"{method}.jsonl"
        bench.run(runner, tokenizer, chosen, files[method], method, bench.Settings(method, max_new_tokens=8))

    def speed(path):  # written from the format, not from their code
        rates, lengths = [], []
        for line in path.read_text().splitlines():
            choice = json.loads(line)["choices"][0]
            rates.append(sum(choice["new_tokens"]) / sum(choice["wall_time"]))
            lengths.extend(choice["accept_lengths"])
        return float(numpy.mean(rates)), float(numpy.mean(numpy.array(lengths, dtype=float)))

    base_speed, _ = speed(files["hf_generate"])
    entries = report.compare(list(files.values()), files["hf_generate"], labels=list(files))
    for entry, (method, path) in zip(entries, files.items()):
        rate, mean_length = speed(path)
        total = entry["categories"]["all"]
        assert total["mean_question_tokens_per_s"] == pytest.approx(rate)
        assert total["mean_question_speedup"] == pytest.approx(rate / base_speed)
        rows = bench.read_rows(path)
        cycles = sum(sum(r["choices"][0]["idxs"]) for r in rows)
        assert numpy.isfinite(mean_length) and mean_length * cycles == pytest.approx(total["new_tokens"] - 2 * len(rows))
    assert "tokens/s, mean of questions" in report.markdown(entries)


def test_the_peers_and_the_greedy_check_decode_plainly_whatever_the_model_s_generation_config(tmp_path):
    """transformers fills what a call leaves unset from the model's generation config (a hub checkpoint's
    repetition_penalty, ...): the peers and check-greedy's reference decode plain greedy all the same, and
    check-greedy reuses rows of its own settings only."""
    from tokenizers import Tokenizer, models as token_models, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    from eagle_mdsd import checks

    words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(14)]  # 16 tokens: a random model's greedy answer repeats
    tokenizer = Tokenizer(token_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<eos>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                          eos_token_id=1, tie_word_embeddings=False)).eval()
    target.generation_config = GenerationConfig(repetition_penalty=1.3, no_repeat_ngram_size=2, min_new_tokens=5,
                                                eos_token_id=1)
    target.save_pretrained(tmp_path / "target")
    fast.save_pretrained(tmp_path / "target")
    prompt = [2, 3, 4, 5]
    plain = engine.Decoder(target, eos_token_ids=[1]).generate(prompt, 12, method="baseline").token_ids
    with torch.inference_mode():  # what a bare generate call decodes on this model: not greedy
        configured = target.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)[0, len(prompt):]
    assert configured.tolist() != plain
    peer = peers.TransformersPeer(target, eos_token_ids=[1])
    assert peer.generate(prompt, 12).token_ids == peer.generate(prompt, 12, method="prompt_lookup").token_ids == plain
    assert target.generation_config.repetition_penalty == 1.3  # the model's own config is left as it was
    settings = dict(question_count=1, trees=(checks.BASELINE, "chain2"), dtypes=("float32",),
                    base_model=str(tmp_path / "target"))
    rows = checks.greedy_equivalence(tmp_path / "rows.jsonl", max_new_tokens=6, **settings)
    assert [row["identical"] for row in rows] == [True, True]
    longer = checks.greedy_equivalence(tmp_path / "rows.jsonl", max_new_tokens=9, **settings)
    assert [row["identical"] for row in longer] == [True, True] and longer[0]["max_new_tokens"] == 9  # anew
    shutil.copytree(tmp_path / "target", tmp_path / "other" / "target")  # another model of the same name
    checks.greedy_equivalence(tmp_path / "rows.jsonl", max_new_tokens=9, **settings | {
        "base_model": str(tmp_path / "other" / "target")})
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 6  # its rows made anew, not reused


def test_second_turn_sees_the_first_answer(small_chat_model):
    _, tokenizer = small_chat_model
    ids = bench.conversation_ids(tokenizer, ["Say hi.", "Again."], ["hi"])
    text = tokenizer.decode(ids)
    assert text.index("Say hi.") < text.index("hi", text.index("Say hi.") + 7) < text.index("Again.")


def test_peers_match_the_engine_and_count_passes(small_chat_model):
    target, tokenizer = small_chat_model
    prompt = models.chat_prompt_ids(tokenizer, "Name a color.")
    baseline = engine.Decoder(target).generate(prompt, 12, method="baseline")
    peer = peers.TransformersPeer(target, eos_token_ids=[])
    greedy = peer.generate(prompt, 12, method="hf_generate")
    lookup = peer.generate(prompt, 12, method="prompt_lookup")
    assert greedy.token_ids == baseline.token_ids == lookup.token_ids
    assert greedy.cycles == 11  # one forward per token after the prefill's
    assert 1 <= lookup.cycles <= 11
    first, again = (peer.generate(prompt, 12, temperature=1.0, seed=3) for _ in range(2))
    assert first.token_ids == again.token_ids and len(first.token_ids) == 12
    with pytest.raises(ValueError, match="unknown peer method"):
        peer.generate(prompt, 4, method="medusa")


def test_peer_sampling_ignores_the_models_top_k_and_top_p(small_chat_model):
    target, _ = small_chat_model
    config = peers.TransformersPeer(target, [2]).generation_config(8, 0.7, "hf_generate")
    assert config.do_sample and config.temperature == 0.7 and config.top_k == 0 and config.top_p == 1.0


def _fake_row(qid, category, tokens, seconds, cycles):
    return {"question_id": qid, "category": category, "model_id": "m",
            "choices": [{"new_tokens": tokens, "wall_time": seconds, "idxs": cycles, "turns": ["a"] * len(tokens)}]}


def test_report_recomputes_from_the_files(tmp_path):
    fast, slow = tmp_path / "fast.jsonl", tmp_path / "slow.jsonl"
    fast.write_text("\n".join(json.dumps(r) for r in [_fake_row(1, "x", [10, 20], [1.0, 1.0], [5, 10]),
                                                        _fake_row(2, "y", [30], [1.0], [10])]) + "\n")
    # the baseline lacks question 2: speedups compare question 1 only
    slow.write_text(json.dumps(_fake_row(1, "x", [10, 20], [3.0, 3.0], [10, 20])) + "\n")
    entries = report.compare([fast, slow], baseline=slow, labels=["fast", "slow"])
    overall = entries[0]["categories"]["all"]
    assert overall["tokens_per_s"] == pytest.approx(60 / 3) and overall["tau"] == pytest.approx(60 / 25)
    assert overall["speedup"] == pytest.approx((30 / 2) / (30 / 6))
    assert entries[0]["categories"]["x"]["speedup"] == pytest.approx(3.0)
    assert entries[1]["categories"]["all"]["speedup"] == pytest.approx(1.0)
    md, png = report.write([fast, slow], tmp_path / "rep", baseline=slow, labels=["fast", "slow"])
    # total tokens over total time 60 / 3; the mean of the questions' rates (30 / 2 + 30 / 1) / 2
    assert overall["mean_question_tokens_per_s"] == pytest.approx(22.5)
    assert "| fast | 2 | 60 | 2.40 | 20.0 | 22.5 | 3.00x | 3.00x |" in md.read_text()
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="missing or empty"):
        report.compare([tmp_path / "none.jsonl"])
    assert cli.main(["report", str(fast), str(slow), "--labels", "a,b", "--out", str(tmp_path / "cli")]) == 0
    assert "| a | 2 | 60 |" in (tmp_path / "cli.md").read_text()
    assert "Acceptance by depth" not in (tmp_path / "cli.md").read_text()  # no accept_lengths in these rows
    assert cli.main(["report", str(fast), str(slow), "--labels", "a", "--out", str(tmp_path / "cli")]) == 2


def test_a_line_that_is_not_an_answer_record_is_a_one_line_error_naming_it(tmp_path):
    answers = tmp_path / "answers.jsonl"
    good = json.dumps(_fake_row(1, "x", [10], [1.0], [5]))
    for bad, problem in (('{"question_id": 2, "choices": [', "is not JSON"),
                         ("[1, 2]", "is not an answer record \\(the line is a JSON list, not an object"),
                         ('{"question_id": 2}', "is not an answer record \\(no choices\\)"),
                         (json.dumps({"question_id": 2, "choices": [{"turns": ["a"], "new_tokens": [3],
                                                                     "wall_time": [1.0]}]}),
                          "is not an answer record \\(no choices\\[0\\].idxs"),
                         (json.dumps(_fake_row(2, "x", [10, 12], [1.0], [5, 6])), "is not an answer record .*of different lengths")):
        answers.write_text(good + "\n\n" + bad + "\n")
        with pytest.raises(ValueError, match=f"answers.jsonl, line 3 {problem}"):
            bench.read_rows(answers)  # what report and a resumed bench read
        assert cli.main(["report", str(answers), "--out", str(tmp_path / "rep")]) == 2
    answers.write_text(good + "\n")
    assert [row["question_id"] for row in bench.read_rows(answers)] == [1]


def test_report_pairs_tau_per_question_against_the_first_drafting_file(tmp_path):
    def drafted(qid, tokens, cycles):
        row = _fake_row(qid, "x", tokens, [1.0] * len(tokens), cycles)
        row["choices"][0]["accept_lengths"] = [[2] * n for n in cycles]
        return row

    files = {name: tmp_path / f"{name}.jsonl" for name in ("plain", "first", "second")}
    files["plain"].write_text(json.dumps(_fake_row(1, "x", [8], [1.0], [8])) + "\n")  # no drafts: not paired
    files["first"].write_text("\n".join(json.dumps(r) for r in [drafted(1, [8, 4], [4, 2]), drafted(2, [9], [3]),
                                                                   drafted(3, [5], [5])]) + "\n")
    files["second"].write_text("\n".join(json.dumps(r) for r in [drafted(1, [9, 3], [3, 1]), drafted(2, [8], [4]),
                                                                    drafted(4, [6], [2])]) + "\n")
    assert not any("paired_tau" in entry for entry in report.compare(list(files.values()), labels=list(files)))
    entries = report.compare(list(files.values()), labels=list(files), paired=True)
    # questions 1 and 2 in both: tau 12/6 -> 12/4 (+1) and 9/3 -> 8/4 (-1)
    assert entries[2]["paired_tau"] == {"against": "first", "questions": 2, "mean": pytest.approx(0.0),
                                        "standard_error": pytest.approx(1.0),  # sample sd sqrt(2), over sqrt(2)
                                        "higher": 1, "lower": 1}
    assert "paired_tau" not in entries[0] and "paired_tau" not in entries[1]
    assert "| second | 2 | +0.000 | 1.000 | 1 | 1 |" in report.markdown(entries)
    assert cli.main(["report", *map(str, files.values()), "--paired", "--out", str(tmp_path / "cli")]) == 0
    assert "| m | 2 | +0.000 | 1.000 | 1 | 1 |" in (tmp_path / "cli.md").read_text()  # labels: the model_id
    # a file of EAGLE's answers drafted, even where no draft was accepted: it stays the reference
    files["first"].write_text("".join(json.dumps(_fake_row(q, "x", [8], [1.0], [8])
                                                 | {"settings": {"method": "eagle"}}) + "\n" for q in (1, 2)))
    entries = report.compare(list(files.values()), labels=list(files), paired=True)
    assert entries[2]["paired_tau"]["against"] == "first"


def test_a_category_named_all_stands_apart_from_the_overall_totals(tmp_path):
    # a question file named all.jsonl names its questions' category "all", as the overall totals are named
    answers = tmp_path / "all.jsonl"
    answers.write_text("\n".join(json.dumps(_fake_row(q, "all", [10], [1.0], [5])) for q in (1, 2)) + "\n")
    summary = report.summarise(answers)
    assert summary["all"]["questions"] == 2 and summary["all (category)"]["questions"] == 2


def test_a_ratio_of_two_rows_is_given_only_over_the_same_questions(tmp_path):
    """A run cut part-way leaves rows of different questions: each row's totals then average other questions,
    so the columns over a peer and the page's ratios give - or nothing there (the speedup over the baseline
    pairs questions itself)."""
    rows = {"baseline": [(1, 1.0), (2, 1.0), (3, 1.0)], "hf_generate": [(1, 1.0), (2, 1.0)],
            "eagle": [(1, 2.0), (2, 2.0), (3, 2.0)], "prompt_lookup": [(1, 2.0), (2, 2.0)]}
    files = {}
    for label, answered in rows.items():  # question 3 is long and runs faster a token
        files[label] = tmp_path / f"{label}.jsonl"
        files[label].write_text("".join(json.dumps(_fake_row(q, "x", [200 if q == 3 else 20],
                                                             [(4.0 if q == 3 else 1.0) / speed], [20])) + "\n"
                                        for q, speed in answered))
    entries = report.compare(list(files.values()), files["baseline"], labels=list(files))
    table = report.markdown(entries, ("hf_generate",))
    assert "| eagle | 3 | 240 | 4.00 | 80.0 | 60.0 | 2.00x | 2.00x | - |" in table
    assert "| prompt_lookup | 2 | 40 | 1.00 | 40.0 | 40.0 | 2.00x | 2.00x | 2.00x |" in table
    assert "x METHOD: - where the two rows answered different questions" in table
    assert not any("prompt_lookup" in line for line in pages.comparisons(entries, 0.0))
    paired = report.compare([files["eagle"], files["baseline"]], files["baseline"], labels=["eagle", "baseline"])
    assert "- where" not in report.markdown(paired, ("baseline",))


def test_profiled_answers_keep_a_file_of_their_own_and_their_own_cycles(tmp_path):
    answers = tmp_path / "answers.jsonl"
    plain, profiled = bench.Settings("eagle"), bench.Settings("eagle", profile=True)
    row = _fake_row(1, "x", [10], [1.0], [5]) | {"settings": plain.record()}
    answers.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match="profile null -> true"):
        bench.check_answer_file(answers, profiled, [{"question_id": 2, "turns": ["t"]}])
    timed = _fake_row(2, "x", [10], [1.0], [5])
    timed["choices"][0]["profile"] = [{"draft": 0.1, "verify": 0.05}]
    # ms a cycle over the profiled answer's 5 cycles, not over every row's 10 (answers of older files mix)
    assert report._totals([_fake_row(1, "x", [10], [1.0], [5]), timed])["ms_per_cycle"] == \
        pytest.approx({"draft": 20.0, "verify": 10.0})
    # the table shows the phases the cycle times, not the columns of answers timed before the one cycle
    entry = {"label": "eagle", "categories": {"all": {"ms_per_cycle": {"draft": 20.0, "verify": 10.0}}}}
    assert report._phase_table([entry])[3:] == ["| method | draft | verify | sum |", "|---|---|---|---|",
                                               "| eagle | 20.0 | 10.0 | 30.0 |"]


def test_where_and_how_bench_timed_its_answers_is_recorded_where_not_the_defaults():
    from eagle_mdsd.cli import bench as bench_command

    def recorded(*flags):
        args = cli.build_parser().parse_args(["bench", "--method", "baseline", *flags])
        return bench_command.row_settings(args).record()

    assert not {"device", "kernels", "cuda_graphs"} & set(recorded())  # as the rows of older files
    assert {"kernels": "stock", "cuda_graphs": "off"}.items() <= recorded("--kernels", "stock", "--cuda-graphs",
                                                                           "off").items()


def test_report_acceptance_by_depth():
    # cycles accepting 0, 0, 1, 2, 2 drafts: 3 of 5 reach depth 1, 2 of those 3 depth 2, none depth 3
    assert report.acceptance_by_depth([1, 1, 2, 3, 3]) == pytest.approx([3 / 5, 2 / 3])
    assert report.acceptance_by_depth([1, 1]) == []
    row = _fake_row(1, "x", [9], [1.0], [5])
    row["choices"][0]["accept_lengths"] = [[1, 1, 2, 3, 2]]
    totals = report._totals([row])
    assert totals["acceptance_by_depth"] == pytest.approx([3 / 5, 1 / 3])
    text = report.markdown([{"label": "m", "categories": {"all": totals}}])
    assert "| m | 0.600 | 0.333 |" in text


def test_report_tau_by_position_in_the_answer(tmp_path):
    row = _fake_row(1, "x", [11, 9], [1.0, 1.0], [4, 8])
    # turn 1: cycles start at positions 1, 3 (window 0) and 6, 7 (window 1); turn 2: one token a cycle
    row["choices"][0]["accept_lengths"] = [[2, 3, 1, 4], [1] * 8]
    assert report.tau_by_position([row], 4) == [(8, 5), (9, 6), (1, 1)]
    assert report.tau_by_position([row], 100) == [(18, 12)]
    flat = json.loads(json.dumps(row))  # the same cycles as one flat list, split by idxs
    flat["choices"][0]["accept_lengths"] = [2, 3, 1, 4] + [1] * 8
    assert report.tau_by_position([flat], 4) == [(8, 5), (9, 6), (1, 1)]
    answers = tmp_path / "answers.jsonl"
    answers.write_text(json.dumps(row) + "\n")
    assert "tau_by_position" not in report.compare([answers])[0]
    text = report.markdown(report.compare([answers], labels=["m"], window=4))
    assert "| method | 0-3 | 4-7 | 8-11 |" in text and "| m | 1.60 | 1.50 | 1.00 |" in text
    assert cli.main(["report", str(answers), "--window", "4", "--out", str(tmp_path / "rep")]) == 0
    assert "| m | 1.60 | 1.50 | 1.00 |" in (tmp_path / "rep.md").read_text()
    assert cli.main(["report", str(answers), "--window", "0", "--out", str(tmp_path / "rep")]) == 2


def test_shards_answer_disjoint_questions_and_merge_sorted(tmp_path, small_chat_model):
    target, tokenizer = small_chat_model
    decoder = engine.Decoder(target)
    chosen = questions.load("mt_bench")[:5]
    answer_file = tmp_path / "answers[1]*.jsonl"  # a name glob would read as a pattern
    another = tmp_path / "answers1x.shard000-of-002.jsonl"  # a shard of another file: never this file's
    another.write_text("")
    settings = bench.Settings("baseline", max_new_tokens=3, turns=1)
    bench.run(decoder, tokenizer, chosen[:1], answer_file, "tiny", settings)  # finished before the sharded run
    for index in (1, 0):  # as two `accelerate launch` processes, the second one first
        bench.run(decoder, tokenizer, chosen, answer_file, "tiny", settings, process=(index, 2))
    assert len(bench.shard_files(answer_file)) == 2
    assert bench.finished_ids(answer_file) == {81, 82, 83, 84, 85}  # a rerun would resume from the shards
    bench.merge_shards(answer_file)
    assert bench.shard_files(answer_file) == []
    assert [r["question_id"] for r in bench.read_rows(answer_file)] == [81, 82, 83, 84, 85] and another.exists()


def test_a_write_cut_short_is_not_a_finished_question_and_the_rerun_drops_it(tmp_path, small_chat_model):
    target, tokenizer = small_chat_model
    decoder = engine.Decoder(target)
    chosen = questions.load("mt_bench")[:3]
    answer_file = tmp_path / "answers.jsonl"
    settings = bench.Settings("baseline", max_new_tokens=3, turns=1)
    bench.run(decoder, tokenizer, chosen[:1], answer_file, "tiny", settings, warmup=False)
    finished = answer_file.read_text()
    with answer_file.open("a") as handle:  # the next question's line, cut off inside the write
        handle.write(finished[: len(finished) // 2].replace('"question_id": 81', '"question_id": 82'))
    assert bench.finished_ids(answer_file) == {81}
    bench.run(decoder, tokenizer, chosen, answer_file, "tiny", settings, warmup=False)
    assert answer_file.read_text().startswith(finished)
    assert [r["question_id"] for r in bench.read_rows(answer_file)] == [81, 82, 83]
    # cut short right before its newline: the record is whole but unfinished, answered again
    answer_file.write_text(answer_file.read_text().rstrip("\n"))
    assert bench.finished_ids(answer_file) == {81, 82}
    bench.run(decoder, tokenizer, chosen, answer_file, "tiny", settings, warmup=False)
    assert [r["question_id"] for r in bench.read_rows(answer_file)] == [81, 82, 83]


def test_jsonl_files_skip_and_drop_a_line_cut_short(tmp_path):
    from eagle_mdsd import jsonl

    path = tmp_path / "rows.jsonl"
    assert jsonl.records(path) == [] and jsonl.lines(path) == []
    path.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3')
    assert jsonl.records(path) == [{"a": 1}, {"a": 2}] and [n for n, _ in jsonl.lines(path)] == [1, 3]
    assert path.read_text().endswith('{"a": 3')  # reading writes nothing
    jsonl.drop_cut_short_line(path)
    assert path.read_text() == '{"a": 1}\n\n{"a": 2}\n'
    jsonl.drop_cut_short_line(path)
    assert path.read_text() == '{"a": 1}\n\n{"a": 2}\n'
    path.write_text('{"a": 1')  # nothing finished at all
    jsonl.drop_cut_short_line(path)
    assert path.read_text() == "" and jsonl.records(path) == []
    path.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(ValueError, match=r"rows.jsonl, line 2 is not JSON \(.*\): delete that line"):
        jsonl.records(path)


def test_fastchat_template_for_models_it_knows(small_chat_model):
    _, tokenizer = small_chat_model
    assert bench.fastchat_template(None) is None and bench.fastchat_template("HuggingFaceTB/SmolLM2-135M") is None
    vicuna = bench.fastchat_template("lmsys/vicuna-7b-v1.3")
    text = tokenizer.decode(bench.conversation_ids(tokenizer, ["Hi.", "More."], ["Hello."], vicuna))
    assert "USER: Hi. ASSISTANT: Hello." in text and text.rstrip().endswith("USER: More. ASSISTANT:")


def test_spread_takes_questions_round_robin_over_categories():
    chosen = selection.spread(questions.load("mt_bench"), 10)
    assert len(chosen) == 10 and len({q["category"] for q in chosen}) == 8
    assert [q["question_id"] for q in chosen][:3] == [81, 82, 91]


def test_question_range_selects_a_slice_and_refuses_an_empty_one():
    assert [q["question_id"] for q in questions.select("mt_bench", 2, 4)] == [83, 84]
    assert len(questions.select("writing", None, None)) == len(questions.load("writing"))
    for begin, end in ((5, 2), (80, 90)):
        with pytest.raises(ValueError, match=f"--question-begin {begin} --question-end {end} selects none of the 80"):
            questions.select("mt_bench", begin, end)


def test_a_question_file_of_your_own(tmp_path):
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps({"prompt": "Say hi."}) + "\n\n"
                    + json.dumps({"question_id": 7, "category": "chat", "turns": ["Hi?", "And then?"]}) + "\n")
    assert questions.select(str(mine), None, None) == [
        {"question_id": 0, "category": "mine", "turns": ["Say hi."]},
        {"question_id": 7, "category": "chat", "turns": ["Hi?", "And then?"]}]
    (tmp_path / "broken.jsonl").write_text('{"prompt": "cut')
    with pytest.raises(ValueError, match="broken.jsonl line 1 is not JSON"):
        questions.load(str(tmp_path / "broken.jsonl"))
    (tmp_path / "bad.jsonl").write_text(json.dumps({"text": "no turns"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl line 1 has neither 'turns' nor 'prompt'"):
        questions.load(str(tmp_path / "bad.jsonl"))
    for record in ({"turns": "one text, not a list"}, {"turns": []}, {"turns": ["A?", 3]}, {"prompt": ""},
                   {"prompt": ["A?"]}):  # a text is no list of turns, though it iterates as one
        (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": "Fine."}) + "\n" + json.dumps(record))
        with pytest.raises(ValueError, match="bad.jsonl line 2 is not a question \\((turns|prompt) must be a non-"):
            questions.load(str(tmp_path / "bad.jsonl"))
    (tmp_path / "bad.jsonl").write_text(json.dumps(["A?", "B?"]) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl line 1 is not a question \\(the line is a JSON list"):
        questions.load(str(tmp_path / "bad.jsonl"))
    (tmp_path / "twice.jsonl").write_text(json.dumps({"prompt": "A?"}) + "\n"
                                          + json.dumps({"question_id": 0, "turns": ["B?"]}))
    with pytest.raises(ValueError, match="question_id 0 appears twice in .*twice.jsonl"):
        questions.load(str(tmp_path / "twice.jsonl"))
    with pytest.raises(UsageError, match="question file .*nope.jsonl does not exist"):
        questions.load(str(tmp_path / "nope.jsonl"))


@pytest.mark.parametrize("argv", [["benchmark", "--questions", "0"], ["sweep", "--questions", "-2"],
                                  ["bench", "--turns", "-1"], ["check-greedy", "--questions", "many"]])
def test_question_and_turn_counts_are_checked_before_anything_runs(argv, capsys):
    from eagle_mdsd import cli

    with pytest.raises(SystemExit) as stop:
        cli.build_parser().parse_args(argv)
    assert stop.value.code == 2 and f"argument {argv[1]}:" in capsys.readouterr().err
    assert cli.build_parser().parse_args(["bench", "--turns", "0"]).turns == 0


def test_an_answer_file_that_is_a_folder_is_refused_before_the_model_loads(tmp_path, monkeypatch, capsys):
    from eagle_mdsd import cli

    monkeypatch.setattr(models, "load_target", lambda *args: pytest.fail("the model loaded"))
    assert cli.main(["bench", "--question-end", "1", "--answer-file", str(tmp_path)]) == 2
    assert f"--answer-file {tmp_path} is a folder" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["generate", "--prompt", "hi", "--method", "prompt_lookup", "--tree", "chain2"], "--tree does nothing"),
    (["generate", "--prompt", "hi", "--method", "baseline", "--drafter", "greedy", "--verifier", "greedy"],
     "--drafter, --verifier do nothing with --method baseline: drop them"),
    (["bench", "--method", "hf_generate", "--kernels", "packed"], "--kernels does nothing with --method hf_generate"),
    (["generate", "--prompt", "hi", "--method", "prompt_lookup", "--profile"], "--profile does nothing"),
    (["bench", "--method", "baseline", "--ea-model", "random", "--total-tokens", "30"],
     "--ea-model, --total-tokens do nothing"),
])
def test_eagle_options_with_another_method_are_refused_before_the_model_loads(argv, message, monkeypatch, capsys):
    from eagle_mdsd import cli, models

    monkeypatch.setattr(models, "load_target", lambda *args: pytest.fail("the model loaded"))
    assert cli.main(argv) == 2  # they were parsed and ignored: the answers came from the plain method
    assert message in capsys.readouterr().err


def test_benchmark_options_that_would_do_nothing_are_refused(monkeypatch, capsys):
    from eagle_mdsd import cli

    monkeypatch.setattr(benchmark_run, "run_benchmark", lambda *args: pytest.fail("the benchmark ran"))
    for argv, message in ((["--methods", "baseline,hf_generate", "--trees", "chain2"],
                           "--trees does nothing without eagle in --methods"),
                          (["--temperatures", "0", "--sampling-tree", "chain3", "--sampling-pair", "same"],
                           "--sampling-pair, --sampling-tree do nothing without a temperature above 0: drop them"),
                          (["--all", "--questions", "8"],  # the default's value, given: refused all the same
                           "--questions 8 does nothing with --all (every question of mt_bench): drop it, or drop --all")):
        assert cli.main(["benchmark", *argv]) == 2
        assert message in capsys.readouterr().err


def test_the_benchmark_answers_8_questions_unless_told_how_many_or_all(monkeypatch, tmp_path):
    from eagle_mdsd import cli

    monkeypatch.chdir(tmp_path)
    counts = []
    monkeypatch.setattr(benchmark_run, "run_benchmark", lambda out, answers, plan, *rest: counts.append(plan.count))
    for argv in ([], ["--questions", "3"], ["--all"]):
        assert cli.main(["benchmark", "--name", f"run{len(counts)}", *argv]) == 0
    assert counts == [8, 3, None]


def test_the_main_command_measures_afresh_in_a_clone_whose_committed_answers_carry_todays_date(
        monkeypatch, tmp_path, capsys):
    """A fresh clone once re-reported another machine's committed answers of the same day as its own; now every
    benchmark run writes a new run folder, and continuing one is asked for with --resume."""
    import datetime

    from eagle_mdsd import cli

    monkeypatch.chdir(tmp_path)
    today = datetime.date.today().isoformat()
    for committed in (f"evaluation/answers/benchmark/benchmark_{today}_bfloat16", f"runs/benchmark/benchmark_{today}"):
        (tmp_path / committed).mkdir(parents=True)
        (tmp_path / committed / "settings.json").write_text("{}")  # timed on another machine
    calls, commands = [], []

    def measured(out, answers, plan, process, barrier, command):
        calls.append((out, answers, plan.name))
        commands.append(command)
        (out / f"{plan.name}.md").parent.mkdir(parents=True, exist_ok=True)
        (out / f"{plan.name}.md").write_text("page")
        return {"name": plan.name}

    monkeypatch.setattr(benchmark_run, "run_benchmark", measured)
    assert cli.main(["benchmark"]) == 0
    out, answers, name = calls[-1]
    assert out == answers == Path("runs/benchmark") and name.startswith(today) and not (answers / name).exists()
    assert cli.main(["benchmark", "--name", "mine"]) == 0 and calls[-1][2] == "mine"
    assert commands == ["eagle-mdsd benchmark", "eagle-mdsd benchmark --name mine"]  # what the page names
    (tmp_path / "runs/benchmark/mine").mkdir()  # its answers, as a run that was cut short leaves them
    assert cli.main(["benchmark", "--name", "mine"]) == 2
    assert "runs/benchmark/mine exists: pass --resume mine to continue that run" in capsys.readouterr().err
    assert cli.main(["benchmark", "--resume", "mine"]) == 0 and calls[-1] == (Path("runs/benchmark"),) * 2 + ("mine",)
    published = f"evaluation/answers/benchmark/benchmark_{today}_bfloat16"  # a path: the page goes beside it
    assert cli.main(["benchmark", "--resume", published]) == 0
    assert calls[-1] == (Path("evaluation/answers/benchmark"),) * 2 + (f"benchmark_{today}_bfloat16",)
    assert cli.main(["benchmark", "--resume", "nothing"]) == 2
    assert "--resume nothing: no run folder there nor under runs/benchmark" in capsys.readouterr().err
    assert cli.main(["benchmark", "--resume", "mine", "--name", "other"]) == 2
    assert "--name and --resume both name the benchmark run" in capsys.readouterr().err
    assert len(calls) == 4


def test_the_benchmark_shards_its_questions_over_two_cpu_processes_and_merges_them(tmp_path):
    """`torchrun --nproc_per_node 2` (gloo on CPU; `accelerate launch` on GPUs): each process answers every other
    question into shard files, and the first merges them and writes the one report."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
               "-m", "eagle_mdsd.cli", "benchmark", "--methods", "baseline,eagle", "--temperatures", "0",
               "--trees", "chain2", "--questions", "4", "--max-new-tokens", "4", "--answers", str(tmp_path),
               "--out", str(tmp_path), "--name", "sharded"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    files = sorted((tmp_path / "sharded").glob("*.jsonl"))
    assert len(files) == 2 and not any("shard" in f.name for f in files)  # merged, shards gone
    for path in files:
        ids = [row["question_id"] for row in bench.read_rows(path)]
        assert len(ids) == 4 and ids == sorted(ids)
    assert (tmp_path / "sharded.md").exists() and done.stdout.count("wrote ") == 1  # one report, by the first


def _entry(label, speed):
    return {"label": label, "categories": {"all": {"tokens_per_s": speed}}}


def test_the_page_compares_each_eagle_row_with_prompt_lookup_as_measured_ratios():
    lines = pages.comparisons([_entry("eagle[eagle_default]", 50.0), _entry("eagle[chain2]", 45.0),
                               _entry("hf_generate", 20.0), _entry("prompt_lookup", 30.0)], 0.0)
    assert lines == ["eagle[eagle_default] / prompt_lookup at T=0: 50.0 / 30.0 tokens/s = 1.67x",
                     "eagle[chain2] / prompt_lookup at T=0: 45.0 / 30.0 tokens/s = 1.50x"]
    assert pages.comparisons([_entry("eagle", 50.0), _entry("prompt_lookup", 20.0)], 1.0) == [
        "eagle / prompt_lookup at T=1: 50.0 / 20.0 tokens/s = 2.50x"]
    # over generate: the table's column (test_the_table_gives_every_rows_speedup_over_generate_where_generate_ran)
    assert pages.comparisons([_entry("eagle", 50.0), _entry("baseline", 25.0), _entry("hf_generate", 20.0)], 0) == []


def test_the_page_gives_each_eagle_trees_time_a_cycle_and_tau():
    # 100 new tokens in 50 cycles over 4 s: 80 ms a cycle, 25 tokens/s at tau 2
    tree = {"label": "eagle[eagle_default]",
            "categories": {"all": {"tokens_per_s": 25.0, "cycles": 50, "wall_time_s": 4.0, "tau": 2.0}}}
    lines = pages.comparisons([tree, _entry("hf_generate", 20.0)], 0.0)
    assert lines == ["eagle[eagle_default] at T=0: 80.0 ms a cycle (wall time / cycles, prefill included), tau 2.00"]


def test_every_method_the_suite_offers_answers_transformers_greedy_tokens_at_t0(monkeypatch):
    from transformers import CompileConfig

    from eagle_mdsd import peers

    # hf_compiled traced by dynamo but run eagerly: inductor's compile (about 20 s on a cold cache) and its
    # answers are tests/test_compiled_peer.py's
    config = CompileConfig(backend="eager", mode=None)
    config._compile_all_devices = True
    monkeypatch.setattr(peers, "compile_config", lambda device: config)
    target = tiny_target(vocab=64, hidden=64)
    draft_head, topology = head.random_head(target), tree.load("chain4")
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]  # repeats, so that prompt lookup finds drafts
    with torch.inference_mode():
        greedy = target.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None)
    for method in plans.METHODS:
        runner = runners.make_runner(method, target, None, draft_head, topology)
        answer = runner.generate(prompt, 12, 0.0, 0, method).token_ids
        assert answer == greedy[0, len(prompt):].tolist()[: len(answer)] and answer, method
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        runners.make_runner("nope", target, None)


def test_cli_sampling_defaults_are_the_suites():
    from eagle_mdsd import cli

    assert cli.build_parser().parse_args(["benchmark"]).sampling_pair == plans.SAMPLING_PAIR
    assert cli.build_parser().parse_args(["benchmark"]).sampling_tree == plans.SAMPLING_TREE


def test_a_killed_run_resumes_without_lost_or_duplicate_questions(tmp_path):
    """Killed after its first answer, a run of three short answers resumes with the other two: nothing lost,
    nothing answered twice (three questions are the fewest that leave answers on both sides of the kill)."""
    import signal
    import subprocess
    import sys
    import time

    answer_file = tmp_path / "answers.jsonl"
    command = [sys.executable, "-m", "eagle_mdsd.cli", "bench", "--method", "baseline", "--question-end", "3",
               "--max-new-tokens", "16", "--answer-file", str(answer_file)]
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600  # generous: on a loaded machine the first answer can take minutes
    while time.time() < deadline and run.poll() is None:
        if answer_file.exists() and answer_file.read_text().count("\n") >= 1:
            break
        time.sleep(0.05)
    run.send_signal(signal.SIGKILL)
    run.wait()
    interrupted = bench.read_rows(answer_file)
    assert 1 <= len(interrupted) < 3, "the run should have been killed part-way"
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = bench.read_rows(answer_file)
    assert [r["question_id"] for r in rows] == [81, 82, 83]
    assert [r["answer_id"] for r in rows[: len(interrupted)]] == [r["answer_id"] for r in interrupted]


def test_the_core_page_names_the_slowest_verification_and_alpha_stars_time():
    node = [{"vocab": vocab, "n": n, "scheme": "with_replacement", "verifier": verifier, "verify_ms": ms,
             "draft_ms": 0.1} for vocab, n, verifier, ms in ((32000, 2, "kseq", 0.4), (32000, 8, "kseq", 1.7),
                                                            (32000, 8, "rrs_w", 0.9), (152064, 8, "kseq", 9.0))]
    alpha = [{"vocab": 152064, "n": n, "scheme": scheme, "alpha_star": 0.5, "seconds": seconds}
             for n, scheme, seconds in ((4, "without_replacement", 2.5), (4, "topk", 0.001),
                                        (8, "without_replacement", 7.0))]
    result = {"date": "2026-01-01", "machine": {"cpu": "c", "threads": 2, "torch": "t", "python": "p"}, "node": node,
              "alpha": alpha}
    assert benchmarks.summary(result) == ["slowest verification of one node at V = 32000: with_replacement/kseq n=8, "
                                          "1.700 ms", "alpha* without replacement at V = 152064, n = 4: 2.500 s"]
    page = benchmarks.markdown(result)
    assert page.endswith("## Summary\n\n- slowest verification of one node at V = 32000: with_replacement/kseq n=8, "
                         "1.700 ms\n- alpha* without replacement at V = 152064, n = 4: 2.500 s\n")
    assert "goal" not in page.lower() and "met" not in page


def test_the_table_gives_every_rows_speedup_over_generate_where_generate_ran():
    entries = [{"label": label, "categories": {"all": {"questions": 1, "new_tokens": 10, "tau": tau,
                                                       "tokens_per_s": speed}}}
               for label, speed, tau in (("eagle", 50.0, 2.5), ("hf_generate", 20.0, 1.0), ("baseline", 25.0, 1.0))]
    rows = report.markdown(entries, "hf_generate").splitlines()
    assert rows[0].endswith("| tokens/s, mean of questions | x hf_generate |") and rows[1] == "|---|" + "---|" * 6
    assert [row.rsplit("|", 2)[1] for row in rows[2:5]] == [" 2.50x ", " 1.00x ", " 1.25x "]
    assert "x hf_generate" not in report.markdown(entries[:1] + entries[2:], "hf_generate")  # no generate row
    assert report.markdown(entries) == report.markdown(entries, "prompt_lookup")


def test_the_cpu_headline_page_is_its_json_rendered_and_the_readme_reads_its_numbers():
    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    page = root / re.search(r"\[CPU\]\((evaluation/results/[^)]+\.md)\)", readme).group(1)
    result = json.loads(page.with_suffix(".json").read_text())
    text = page.read_text()
    assert text == pages.benchmark_markdown(result, page.stem)  # measured numbers and all, nothing typed by hand
    assert text.splitlines()[2].startswith("Command: `bash scripts/setup.sh && .venv/bin/eagle-mdsd benchmark`")
    methods = {"transformers `generate`": "hf_generate", "transformers `generate`, compiled": "hf_compiled",
               "prompt lookup (transformers)": "prompt_lookup", "our plain decoding": "baseline",
               "EAGLE, eagle_default": "eagle[eagle_default]", "EAGLE, chain2": "eagle[chain2]"}
    tables, tag, header = {}, None, []
    for line in text.splitlines():  # the page's overall tables: {(temperature, method): tau, tokens/s, x generate}
        tag = line.split()[-1] if line.startswith("## Temperature") else tag
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        header = cells if line.startswith("| method |") else header if line.startswith("|") else []
        if "x hf_generate" in header and cells[0] in methods.values():
            tables[tag, cells[0]] = (cells[header.index("tau")], cells[header.index("tokens/s")],
                                     cells[header.index("x hf_generate")])
    checked = 0
    for line in readme.splitlines():
        if line.startswith("| [CPU]("):
            cells = [cell.strip().strip("*") for cell in line.strip("|").split("|")]
            for tag, (speed, ratio, tau) in (("0", cells[2:5]), ("1", cells[5:8])):
                if speed != "-":
                    assert (tau, speed, ratio) == tables[tag, methods[cells[1]]], (line, tag)
                    checked += 1
    assert checked == 11


def test_the_page_compares_dynamic_trees_with_the_static_default():
    lines = pages.comparisons([_entry("eagle[eagle_default]", 30.0), _entry("eagle[eagle2:total_tokens=16]", 37.5),
                               _entry("eagle[sequoia_cpu]", 40.0)], 0.0)
    assert lines == ["eagle[eagle2:total_tokens=16] / eagle[eagle_default] at T=0: 1.25x"]  # sequoia's is static


def test_a_tree_can_carry_its_own_drafter_and_verifier():
    assert plans.tree_and_pair("eagle_default", "topk", "topk") == ("eagle_default", "topk", "topk")
    assert plans.tree_and_pair("eagle2:top_k=3@greedy/greedy", "topk", "topk") == ("eagle2:top_k=3", "greedy", "greedy")
    with pytest.raises(ValueError, match="TREE@DRAFTER/VERIFIER"):
        plans.tree_and_pair("eagle2@greedy", "topk", "topk")
    lines = pages.comparisons([_entry(label, speed) for label, speed in
                               (("eagle[eagle_default]", 20.0), ("eagle[eagle2:top_k=3@greedy/greedy]", 25.0))], 1.0)
    assert lines == ["eagle[eagle2:top_k=3@greedy/greedy] / eagle[eagle_default] at T=1: 1.25x"]


def test_eagle_with_lookup_drafts_is_compared_as_every_eagle_row_is():
    lines = pages.comparisons([_entry("eagle[eagle_default]", 30.0), _entry("eagle[eagle_default+lookup10]", 60.0),
                               _entry("hf_generate", 20.0), _entry("prompt_lookup", 40.0)], 0.0)
    assert lines == ["eagle[eagle_default] / prompt_lookup at T=0: 30.0 / 40.0 tokens/s = 0.75x",
                     "eagle[eagle_default+lookup10] / prompt_lookup at T=0: 60.0 / 40.0 tokens/s = 1.50x"]


def test_static_trees_share_one_run_on_the_sampling_tree_at_t_above_0(tmp_path):
    plan = plans.BenchmarkPlan(count=1, temperatures=(0.0, 1.0), methods=("eagle",), max_new_tokens=4,
                               trees=("eagle_default", "chain2", "eagle_default+lookup3"), name="shared")
    result = benchmark_run.run_benchmark(tmp_path / "results", tmp_path / "answers", plan)
    labels = {tag: [e["label"] for e in block["entries"]] for tag, block in result["temperatures"].items()}
    assert labels == {"t0": ["eagle[eagle_default]", "eagle[chain2]", "eagle[eagle_default+lookup3]"],
                      "t1": ["eagle[chain2]", "eagle[chain2+lookup3]"]}
    assert len(list((tmp_path / "answers" / "shared").glob("*.jsonl"))) == 5


def test_a_sweep_runs_every_cell_that_fits_and_a_rerun_resumes(tmp_path):
    plan = plans.SweepPlan(trees=("chain2", "binary_depth4"), temperatures=(0.0, 1.0),
                           pairs=(("topk", "topk"), ("spechub", "spechub")), count=1, max_new_tokens=4, name="small")
    page = sweep.sweep(tmp_path / "results", tmp_path / "answers", plan)
    rows = json.loads(page.with_suffix(".json").read_text())["rows"]
    # spechub draws two drafts at every node, so chain2's spechub cells are left out
    assert sorted((r["tree"], r["drafter"], r["temperature"]) for r in rows) == [
        ("binary_depth4", "spechub", 0.0), ("binary_depth4", "spechub", 1.0), ("binary_depth4", "topk", 0.0),
        ("binary_depth4", "topk", 1.0), ("chain2", "topk", 0.0), ("chain2", "topk", 1.0)]
    answers = sorted((tmp_path / "answers" / "small").glob("*.jsonl"))
    assert [f.name for f in answers][-1] == "chain2-topk-topk-t1.jsonl" and len(answers) == 6
    before = [f.read_text() for f in answers]
    sweep.sweep(tmp_path / "results", tmp_path / "answers", plan)  # finished: nothing is answered again
    assert [f.read_text() for f in answers] == before
    assert "| chain2 | topk | topk | " in page.read_text()


def test_a_sweep_or_benchmark_with_nothing_to_run_is_refused(monkeypatch, capsys):
    from eagle_mdsd import cli

    monkeypatch.setattr(models, "load_target", lambda *args: pytest.fail("the model loaded"))
    with pytest.raises(ValueError, match="no pair of --pairs fits any tree of --trees \\(chain2\\)"):
        sweep.sweep("unused", "unused", plans.SweepPlan(trees=("chain2",), pairs=(("spechub", "spechub"),)))
    for command in ("sweep", "benchmark"):  # an empty page, or a bare Errno after the model loaded
        assert cli.main([command, "--temperatures", " , "]) == 2
        assert "--temperatures names no temperature" in capsys.readouterr().err


def test_a_run_whose_answers_were_made_otherwise_says_how_to_go_on(tmp_path):
    answers = tmp_path / "run" / "chain2-topk-topk-t0.jsonl"
    answers.parent.mkdir()
    row = _fake_row(1, "x", [10], [1.0], [5]) | {"settings": bench.Settings("eagle", 2).record()}
    answers.write_text(json.dumps(row) + "\n")
    # a run's files are not chosen by --answer-file, which sweep and benchmark do not have
    with pytest.raises(UsageError, match=r"max_new_tokens 2 -> 3\): continue the run with the options it was made "
                                         r"with, or pass --name NAME"):
        answering.check_files(answers.parent, {"cell": answers}, {"cell": bench.Settings("eagle", 3)},
                              [{"question_id": 2, "turns": ["t"]}], "cpu")


def test_a_benchmark_resumes_only_answers_made_with_the_same_settings(tmp_path):
    folder = tmp_path / "benchmark_x"
    settings = {"head": checkpoint.head_checksum(models.DEFAULT_HEAD), "dtype": "bfloat16", "trees": ["eagle_default"]}
    records.check_settings(folder, settings)  # first run: records them
    (folder / "mt_bench-eagle-t0.jsonl").write_text("{}\n")
    records.check_settings(folder, dict(settings))  # same settings: resumes
    with pytest.raises(ValueError, match="other settings.*head .* -> 0123.*another --name"):
        records.check_settings(folder, settings | {"head": "0123"})
    with pytest.raises(ValueError, match="dtype bfloat16 -> float32"):
        records.check_settings(folder, settings | {"dtype": "float32"})
    (folder / "settings.json").unlink()  # answers of unknown origin are not resumed either
    with pytest.raises(ValueError, match="without a settings.json"):
        records.check_settings(folder, settings)


def test_a_run_folder_resumes_only_under_the_command_that_made_it(tmp_path):
    folder = tmp_path / "r"
    records.open_run_folder(folder, [], new_run=True, kind="sweep")  # a fresh run records its command at once
    records.check_settings(folder, {"dtype": "bfloat16"})  # the answers' settings join that record
    assert json.loads((folder / "settings.json").read_text()) == {"kind": "sweep", "dtype": "bfloat16"}
    records.open_run_folder(folder, [], new_run=False, kind="sweep")
    refused = re.escape(f"{folder} is a sweep run, not a benchmark run") + ".*eagle-mdsd sweep --resume"
    with pytest.raises(UsageError, match=refused):
        records.open_run_folder(folder, [], new_run=False, kind="benchmark")
    (folder / "settings.json").write_text(json.dumps({"dtype": "bfloat16"}))  # recorded before runs named a kind
    records.open_run_folder(folder, [], new_run=False, kind="benchmark")
    (folder / "settings.json").write_text(json.dumps({"kind": "generate"}))
    with pytest.raises(UsageError, match="'kind' that is no command that makes runs"):
        records.open_run_folder(folder, [], new_run=False, kind="benchmark")


def test_answers_name_the_machine_they_were_timed_on(tmp_path, monkeypatch):
    folder = tmp_path / "benchmark_x"
    records.check_settings(folder, {"dtype": "bfloat16"})
    answers, chosen = [folder / "eagle-t0.jsonl"], [{"question_id": 81}, {"question_id": 82}]
    answers[0].write_text(json.dumps(_fake_row(81, "writing", [4], [1.0], [2])) + "\n")
    monkeypatch.setattr(records, "machine", lambda device="cpu": {"cpu": "first cpu", "threads": 2, "torch": "2"})
    assert records.timing_machine(folder, answers, chosen)["cpu"] == "first cpu"  # recorded by the first run
    assert records.check_settings(folder, {"dtype": "bfloat16"}) is None  # the record still resumes
    monkeypatch.setattr(records, "machine", lambda device="cpu": {"cpu": "second cpu", "threads": 2, "torch": "2"})
    with pytest.raises(ValueError, match="timed on first cpu, .* and this machine is second cpu, .*another --name"):
        records.timing_machine(folder, answers, chosen)  # question 82 answered here would mix two machines
    assert records.timing_machine(folder, answers, chosen[:1])["cpu"] == "first cpu"  # all done: a report only
    monkeypatch.setattr(records, "machine", lambda device="cpu": {"cpu": "first cpu", "threads": 2, "torch": "2",
                                                                "gpu": "some GPU x1"})
    with pytest.raises(ValueError, match="timed on first cpu, 2 torch threads, torch 2 and this machine is .*"
                                         "GPU some GPU x1"):
        records.timing_machine(folder, answers, chosen, "cuda")  # the same host with a GPU times another way


def test_the_machine_record_names_the_gpu_a_run_is_timed_on(monkeypatch):
    assert "gpu" not in benchmarks.machine("cuda" if not torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: f"Fake GPU {index}")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert "gpu" not in benchmarks.machine("cpu")
    assert benchmarks.machine("cuda")["gpu"] == "Fake GPU 0 x2"
    assert benchmarks.machine("cuda:1")["gpu"] == "Fake GPU 1 x2"
    assert benchmarks.machine("auto")["gpu"] == "Fake GPU 0 x2"
    assert benchmarks.machine_line(benchmarks.machine("cuda")).endswith(f"torch {torch.__version__}, GPU Fake GPU 0 x2")


def test_the_head_checksum_changes_with_any_file_of_the_head(tmp_path):
    for name in ("config.json", "model.safetensors"):
        (tmp_path / name).write_bytes(b"x")
    before = checkpoint.head_checksum(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"y")
    assert checkpoint.head_checksum(tmp_path) != before


def test_the_benchmark_samples_static_trees_with_the_sampling_pair_at_t_above_0():
    entries = ["eagle_default", "eagle2:total_tokens=10,depth=3,top_k=3", "binary_depth4@greedy/greedy"]
    for sampling_tree in ("same", "chain2"):
        setups = plans.benchmark_setups(entries, "topk", "topk", ("without_replacement", "rrs_wo"), sampling_tree)
        runs = {setup[False][0]: {sampled: (label, topology.size if hasattr(topology, "size") else None, d, v)
                                  for sampled, (label, topology, d, v) in setup.items()} for setup in setups}
        default_at_1 = ("eagle_default", 25, "without_replacement", "rrs_wo") if sampling_tree == "same" else \
            ("chain2", 2, "without_replacement", "rrs_wo")  # only the static tree without its own pair is replaced
        assert runs["eagle_default"] == {False: ("eagle_default", 25, "topk", "topk"), True: default_at_1}
        dynamic_label = next(label for label in runs if label.startswith("eagle2"))
        assert [run[2:] for run in runs[dynamic_label].values()] == [("topk", "topk")] * 2  # grown by topk drafts
        assert runs["binary_depth4@greedy/greedy"][True] == ("binary_depth4@greedy/greedy", 30, "greedy", "greedy")
    shared = plans.benchmark_setups(["eagle_default", "chain4"], "topk", "topk", ("greedy", "greedy"), "chain2")
    assert [setup[False][0] for setup in shared] == ["eagle_default", "chain4"]
    assert [setup[True][0] for setup in shared] == ["chain2", "chain2"]  # at T > 0 one run on the sampling tree
    grafted = ["eagle_default+lookup", "chain4+lookup4", "eagle2:total_tokens=10,depth=3,top_k=3+lookup"]
    for sampling_tree, static_labels in (("same", ["eagle_default+lookup10", "chain4+lookup4"]),
                                         ("chain2", ["chain2+lookup10", "chain2+lookup4"])):
        setups = plans.benchmark_setups(grafted, "topk", "topk", ("without_replacement", "rrs_wo"), sampling_tree)
        assert [setup[True][0] for setup in setups[:2]] == static_labels  # the lookup drafts go along
        assert [setup[True][2:] for setup in setups] == [("without_replacement", "rrs_wo")] * 2 + [("topk", "topk")]
    with pytest.raises(ValueError, match="--sampling-tree eagle2: give a static tree"):
        plans.benchmark_setups(["eagle_default"], "topk", "topk", ("greedy", "greedy"), "eagle2")
    assert plans.parse_sampling_pair("same", "topk", "topk") == ("topk", "topk")
    assert plans.parse_sampling_pair("greedy/greedy", "topk", "topk") == ("greedy", "greedy")
    with pytest.raises(ValueError, match="--sampling-pair 'rrs_wo': write DRAFTER/VERIFIER"):
        plans.parse_sampling_pair("rrs_wo", "topk", "topk")
    with pytest.raises(ValueError, match="rrs_wo"):
        plans.parse_sampling_pair("with_replacement/rrs_wo", "topk", "topk")  # not a lossless pair


def test_a_small_benchmark_runs_end_to_end_with_the_sampling_pair(tmp_path, monkeypatch):
    used = set()  # (method, temperature, drafter, verifier) of every generation
    make_runner = runners.make_runner

    def recording(method, *args, **kwargs):
        runner = make_runner(method, *args, **kwargs)
        generate = runner.generate

        def logged(prompt, max_new_tokens, temperature, *rest, **options):
            used.add((method, temperature, runner.scheme.name if method == "eagle" else None,
                      runner.verifier.name if method == "eagle" else None,
                      runner.tree.size if method == "eagle" else None))
            return generate(prompt, max_new_tokens, temperature, *rest, **options)

        runner.generate = logged
        return runner

    monkeypatch.setattr(runners, "make_runner", recording)
    plan = plans.BenchmarkPlan(count=1, temperatures=(0.0, 1.0), methods=("eagle", "baseline"), max_new_tokens=8,
                               name="small")
    result = benchmark_run.run_benchmark(tmp_path / "results", tmp_path / "answers", plan)
    assert {u for u in used if u[0] == "eagle"} == {("eagle", 0.0, "topk", "topk", 25),
                                                   ("eagle", 1.0, "without_replacement", "rrs_wo", 2)}
    settings = json.loads((tmp_path / "answers" / "small" / "settings.json").read_text())
    assert settings["sampling_pair"] == "without_replacement/rrs_wo" and settings["sampling_tree"] == "chain2"
    packs = kernels.available(torch.zeros(1, dtype=torch.bfloat16))
    assert settings["kernels"] == result["kernels"] == ("packed" if packs else "stock")
    for tag in ("t0", "t1"):
        assert [e["label"] for e in result["temperatures"][tag]["entries"]] == ["eagle", "baseline"]
        answer_file = records.file_safe(f"mt_bench-{models.EMBEDDED_NAME}-eagle-{tag}.jsonl")
        assert len((tmp_path / "answers" / "small" / answer_file).read_text().splitlines()) == 1
    text = (tmp_path / "results" / "small.md").read_text()
    assert ("drafter topk, verifier topk; at T > 0 (static trees) tree chain2, drafter without_replacement, "
            "verifier rrs_wo") in text
    assert ("EAGLE and baseline ran their linear layers on prepacked oneDNN bf16 weights" in text) == packs


def test_trees_and_temperatures_whose_answer_files_would_share_a_name_are_refused(tmp_path):
    """Answer files are named by file_safe(tree) and 6 significant digits of T: two trees or temperatures that
    map to one name would write one file, refused only after a model loaded and a cell was answered."""
    (tmp_path / "sub").mkdir()
    for path in (tmp_path / "sub" / "c.json", tmp_path / "sub_c.json"):
        path.write_text("[[0], [0, 0]]")
    trees = (str(tmp_path / "sub" / "c.json"), str(tmp_path / "sub_c.json"))
    with pytest.raises(errors.UsageError, match="more than once, or as trees whose answer files would share a name"):
        plans.sweep_cells(plans.SweepPlan(trees=trees, temperatures=(0.0,)))
    with pytest.raises(errors.UsageError, match="--temperatures gives t0.1 more than once"):
        plans.SweepPlan(temperatures=(0.1, 0.1000001))


def test_answers_of_no_tokens_report_a_dash_not_a_division_by_zero(tmp_path):
    """A turn may end on EOS at once (0 new tokens): the first half / second half ratio and a speedup over such a
    baseline are '-', not an error."""
    def row(qid, tokens):
        return {"question_id": qid, "category": "writing", "choices": [
            {"turns": ["t"], "new_tokens": [tokens], "idxs": [max(tokens, 1)], "wall_time": [1.0]}]}

    mine, empty = tmp_path / "mine.jsonl", tmp_path / "empty.jsonl"
    mine.write_text("".join(json.dumps(row(q, t)) + "\n" for q, t in ((81, 8), (82, 0))))
    empty.write_text("".join(json.dumps(row(q, 0)) + "\n" for q in (81, 82)))
    page = report.write([mine], tmp_path / "page", baseline=empty)[0].read_text()
    assert "| mine | 0.0 | 4.0 | 8.0 | - |" in page and "nan" not in page


def test_a_cycle_whose_path_ran_past_the_token_budget_is_a_valid_answer(tmp_path):
    """max_new_tokens 4 on eagle_default: a cycle may accept 5 drafts (6 tokens) where the turn keeps 4."""
    row = {"question_id": 81, "category": "writing", "choices": [
        {"turns": ["t"], "new_tokens": [4], "idxs": [1], "wall_time": [1.0], "accept_lengths": [6]}]}
    (tmp_path / "a.jsonl").write_text(json.dumps(row) + "\n")
    assert bench.read_rows(tmp_path / "a.jsonl")[0]["question_id"] == 81


def test_spec_bench_answer_files_read_as_ours(tmp_path):
    """Spec-Bench writes a turn's cycles as `decoding_steps` (EAGLE and this project: `idxs`)."""
    row = {"question_id": 81, "category": "writing", "choices": [
        {"index": 0, "turns": ["a", "b"], "decoding_steps": [3, 2], "new_tokens": [6, 4], "wall_time": [1.0, 1.0],
         "accept_lengths": [2, 2, 2, 2, 2]}]}
    (tmp_path / "spec_bench.jsonl").write_text(json.dumps(row) + "\n")
    total = report.compare([tmp_path / "spec_bench.jsonl"])[0]["categories"]["all"]
    assert total["tau"] == 2.0 and total["tokens_per_s"] == 5.0
