"""Steady-state timing: every method warms up in full before the clock, and pages show each method's per-question
spread and whether their rows are paired."""

from __future__ import annotations

import json

from eagle_mdsd import bench, questions, report
from eagle_mdsd.benchmark import pages, plans, run as benchmark_run, runners, selection


def test_every_method_answers_a_question_outside_the_set_in_full_before_the_clock_starts(tmp_path, monkeypatch):
    events = []  # ("generate", method, T, max_new_tokens) and ("timed", method, T, question) in the order they ran
    make_runner, timed_run = runners.make_runner, bench.run

    def recording(method, *args, **kwargs):
        runner = make_runner(method, *args, **kwargs)
        generate = runner.generate

        def logged(prompt, max_new_tokens, temperature, *rest, **options):
            events.append(("generate", method, temperature, max_new_tokens))
            return generate(prompt, max_new_tokens, temperature, *rest, **options)

        runner.generate = logged
        return runner

    def clocked(runner, tokenizer, chosen, answer_file, model_id, settings, *args, **kwargs):
        events.append(("timed", settings.method, settings.temperature, chosen[0]["question_id"]))
        return timed_run(runner, tokenizer, chosen, answer_file, model_id, settings, *args, **kwargs)

    monkeypatch.setattr(runners, "make_runner", recording)
    monkeypatch.setattr(bench, "run", clocked)
    plan = plans.BenchmarkPlan(count=1, temperatures=(0.0, 1.0), methods=("baseline", "hf_generate"),
                               max_new_tokens=6, name="steady")
    result = benchmark_run.run_benchmark(tmp_path / "results", tmp_path / "answers", plan)
    chosen = selection.spread(questions.load("mt_bench"), 1)
    spare = selection.warmup_question(questions.load("mt_bench"), chosen)
    assert spare["question_id"] not in {q["question_id"] for q in chosen}
    first_timed = next(i for i, e in enumerate(events) if e[0] == "timed")
    warm = events[:first_timed]
    turns = len(spare["turns"])
    for method in ("baseline", "hf_generate"):
        for t in (0.0, 1.0):  # every turn of the spare question, at the benchmark's length, for each answer file
            assert warm.count(("generate", method, t, 6)) == turns
    assert not [e for e in events[first_timed:] if e[0] == "generate" and e[3] != 6]
    assert result["warmup"]["question"] == spare["question_id"]
    assert set(result["warmup"]["warmup_s"]) == {f"{m} T={t}" for m in ("baseline", "hf_generate") for t in (0, 1)}
    for answer_file in (tmp_path / "answers" / "steady").glob("*.jsonl"):  # the warm-up answer is nowhere written
        assert [r["question_id"] for r in bench.read_rows(answer_file)] == [chosen[0]["question_id"]]
    page = (tmp_path / "results" / "steady.md").read_text()
    assert f"Before the clock, every method answered question {spare['question_id']}, outside the set" in page
    assert "Paired: every row answered the same 1 questions." in page
    assert "| method | min | median | max | first half / second half |" in page
    assert json.loads((tmp_path / "results" / "steady.json").read_text())["warmup"] == result["warmup"]


def test_the_compiled_peer_is_prepared_for_the_longest_turn_before_any_warm_up_answer(monkeypatch):
    from eagle_mdsd import peers

    calls = []

    class Compiled(peers.CompiledPeer):
        def __init__(self):
            pass

        def prepare(self, cache_tokens=None):
            calls.append(("prepare", cache_tokens))
            return 1.5

        def generate(self, prompt_ids, max_new_tokens=128, temperature=0.0, seed=0, method="hf_compiled",
                     profile=False):
            calls.append(("generate", len(prompt_ids) + max_new_tokens))
            from eagle_mdsd.engine import GenerationResult
            return GenerationResult(list(prompt_ids), [1, 2], 1, [1], wall_time_s=0.1)

    class Tokenizer:
        def decode(self, ids, skip_special_tokens=True):
            return "ok"

    monkeypatch.setattr(bench, "conversation_ids", lambda tokenizer, turns, answers, template=None: [0] * 10 * len(turns))
    spare = {"question_id": 7, "turns": ["a", "b"]}
    plan = plans.BenchmarkPlan(max_new_tokens=4)
    runner = Compiled()
    warm = runners.warm_up({(False, "hf_compiled"): ("hf_compiled", runner)}, {(0.0, "hf_compiled"): None},
                         Tokenizer(), spare, plan, cache_tokens=99)
    assert calls[0] == ("prepare", 99) and [c[0] for c in calls[1:]] == ["generate", "generate"]
    assert warm["compile_s"] == {"hf_compiled": 1.5} and list(warm["warmup_s"]) == ["hf_compiled T=0"]
    assert "hf_compiled compiled and allocated its static cache first in 2 s" in pages.warmup_note({"warmup": warm})
    # the bound covers every turn: the conversation's prompt, each answer at its length and a re-tokenising margin
    assert runners.longest_turn(Tokenizer(), [spare], 4) == 20 + 2 * 4 + 16


def test_the_page_names_rows_that_answered_other_questions_and_each_rows_spread():
    entries = [{"label": "eagle", "categories": {"all": {"questions": 3, "new_tokens": 30, "tau": 2.0,
                                                         "tokens_per_s": 10.0}},
                "question_tokens_per_s": [[81, 10.0], [91, 20.0], [101, 40.0]]},
               {"label": "hf_generate", "categories": {"all": {"questions": 2, "new_tokens": 20, "tau": 1.0,
                                                               "tokens_per_s": 5.0}},
                "question_tokens_per_s": [[81, 5.0], [91, 5.0]]}]
    text = report.markdown(entries)
    assert "Not paired: the rows answered different questions (hf_generate lacks 101)." in text
    rows = [line for line in text.splitlines() if line.startswith("| eagle | 10.0 |")]
    assert rows == ["| eagle | 10.0 | 20.0 | 40.0 | 0.25 | 10.0 | 20.0 | 40.0 |"]  # 10 / 40: the first half slower
    assert "| hf_generate | 5.0 | 5.0 | 5.0 | 1.00 | 5.0 | 5.0 | - |" in text
    del entries[1]["question_tokens_per_s"]  # a result from before per-question rates: nothing said of them
    assert "Not paired" not in report.markdown(entries[1:]) and "Per question" not in report.markdown(entries[1:])


def test_the_warm_up_question_is_outside_the_set_or_a_spare_one():
    every = questions.load("mt_bench")
    assert selection.warmup_question(every, every) is selection.SPARE_QUESTION
    assert selection.warmup_question(every, every[1:])["question_id"] == every[0]["question_id"]


def test_the_benchmark_table_gives_every_rows_tokens_per_s_over_both_generates():
    entries = [{"label": label, "categories": {"all": {"questions": 1, "new_tokens": 10, "tau": 1.0,
                                                       "tokens_per_s": speed}}}
               for label, speed in (("eagle", 60.0), ("hf_generate", 20.0), ("hf_compiled", 30.0))]
    rows = report.markdown(entries, plans.PEERS).splitlines()
    assert rows[0].endswith("| x hf_generate | x hf_compiled |")
    assert rows[2].endswith("| 3.00x | 2.00x |") and rows[4].endswith("| 1.50x | 1.00x |")
    assert "x hf_compiled" not in report.markdown(entries[:2], plans.PEERS)  # a run without it: no column
