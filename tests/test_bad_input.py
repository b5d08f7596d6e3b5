"""Every row of docs/bad-input.md: the input, and the one line (or the behaviour) the row promises.

Most inputs are refused before a model loads: their tests replace `models.load_target` with a failure.  The
few that need a model use a tiny Llama with a word-level tokenizer saved as a folder (`tiny_chat`).
"""

from __future__ import annotations

import datetime
import json
import re
import shlex
import shutil
import time
from pathlib import Path

import pytest
import torch

from eagle_mdsd import bench, cli, errors, head, models, questions, sequoia
from tiny import tiny_target

DOC = Path(__file__).resolve().parents[1] / "docs" / "bad-input.md"
COVERED: set[str] = set()


def doc_rows() -> dict[str, str]:
    """{id: the quoted text of its last column} of every table row of docs/bad-input.md."""
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) >= 3 and re.fullmatch(r"[a-z0-9-]+", cells[0]) and cells[0] != "id":
            quoted = re.findall(r"`([^`]+)`", cells[-1])
            rows[cells[0]] = quoted[0] if quoted else ""
    return rows


def says(row: str) -> str:
    return doc_rows()[row]


def covers(*rows):
    """Marks a test as the test of these rows of the doc."""
    COVERED.update(rows)
    return lambda test: test


def run(argv, capsys) -> tuple[int, str]:
    """(exit code, stderr) of `eagle-mdsd ARGV` run in this process."""
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as stop:
        code = stop.code
    return code, capsys.readouterr().err


def one_line_error(argv, capsys, row: str | None = None) -> str:
    """The error line of a refused command: exit code 2, one line on stderr, no traceback, the row's text."""
    code, err = run(argv, capsys)
    lines = [line for line in err.splitlines() if line.strip() and not re.search(r"\d+%\|", line)]  # (no tqdm bar)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("eagle-mdsd"), err
    if row is not None:
        assert says(row) in lines[0], (says(row), lines[0])
    return lines[0]


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        pytest.fail("the model loaded: this input should have been refused before")

    monkeypatch.setattr(models, "load_target", refuse)


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory) -> Path:
    """A folder holding a tiny Llama (64 tokens, context 256) and a word-level tokenizer with a chat template."""
    from tokenizers import Tokenizer, models as token_models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_chat")
    words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(62)]
    tokenizer = Tokenizer(token_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<eos>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         eos_token_id=1, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def head_folder(tmp_path_factory) -> Path:
    """A valid EAGLE-1 head (safetensors) for a tiny target of 16 tokens."""
    return head.save_head(head.random_head(tiny_target(vocab=16, hidden=32)), tmp_path_factory.mktemp("head"),
                          safetensors=True)


def _head_variant(head_folder: Path, tmp_path: Path, change) -> Path:
    folder = tmp_path / "head"
    shutil.copytree(head_folder, folder)
    change(folder)
    return folder


def _rewrite_weights(edit):
    from safetensors.torch import load_file, save_file

    def change(folder):
        state = load_file(folder / "model.safetensors")
        edit(state)
        save_file(state, folder / "model.safetensors")
    return change


def _row(qid, wall_time=(1.0,), settings=None, **choice):
    row = {"question_id": qid, "answer_id": "a", "model_id": "m", "category": "writing",
           "choices": [{"index": 0, "turns": ["t"] * len(wall_time), "new_tokens": [4] * len(wall_time),
                        "idxs": [2] * len(wall_time), "wall_time": list(wall_time), "accept_lengths": [2, 2]} | choice],
           "tstamp": 0.0}
    return row | ({"settings": settings} if settings is not None else {})


def _jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _cut_bin(folder):
    """The head as pytorch_model.bin, cut short as an interrupted download leaves it."""
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes((folder / "pytorch_model.bin").read_bytes()[:300])


HEAD_CASES = {
    "head-bin-truncated": _cut_bin,
    "head-corrupt": lambda f: (f / "model.safetensors").write_bytes(b"not a safetensors file" * 8),
    "head-truncated": lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:-64]),
    "head-missing-key": _rewrite_weights(lambda state: state.pop("fc.weight")),
    "head-wrong-dtype": _rewrite_weights(lambda state: state.update({"fc.weight": state["fc.weight"].int()})),
    "head-wrong-shape": _rewrite_weights(lambda state: state.update({"fc.weight": state["fc.weight"][:3]})),
    "head-config": lambda f: (f / "config.json").write_text("{not json"),
    "head-config-value": lambda f: (f / "config.json").write_text(json.dumps(
        json.loads((f / "config.json").read_text()) | {"hidden_size": "32"})),
    "head-draft-vocab": lambda f: (f / "draft_vocab.json").write_text(json.dumps({"token_ids": "1,2"})),
    "head-draft-vocab-twice": lambda f: (f / "draft_vocab.json").write_text(json.dumps({"token_ids": [1, 2, 1]})),
    "head-config-layer": lambda f: (f / "config.json").write_text(json.dumps(
        json.loads((f / "config.json").read_text()) | {"hidden_act": "nope"})),
    "head-rope": lambda f: (f / "config.json").write_text(json.dumps(
        json.loads((f / "config.json").read_text()) | {"rope_theta": -5})),
    "head-norm-eps": lambda f: (f / "config.json").write_text(json.dumps(
        json.loads((f / "config.json").read_text()) | {"rms_norm_eps": -1.0})),
}


@covers(*HEAD_CASES)
@pytest.mark.parametrize("row", HEAD_CASES)
def test_a_broken_head_is_one_line_naming_its_file_before_the_model_loads(row, head_folder, tmp_path, no_model,
                                                                           capsys):
    folder = _head_variant(head_folder, tmp_path, HEAD_CASES[row])
    line = one_line_error(["generate", "--prompt", "hi", "--ea-model", folder], capsys, row)
    assert str(folder) in line


def test_a_head_rope_factor_of_0_is_refused_as_a_bad_theta_is(head_folder, tmp_path, no_model, capsys):
    rope = {"rope_parameters": {"rope_type": "linear", "factor": 0.0, "rope_theta": 10000.0}}
    folder = _head_variant(head_folder, tmp_path, lambda f: (f / "config.json").write_text(json.dumps(
        json.loads((f / "config.json").read_text()) | rope)))
    assert "factor must be a number above 0" in one_line_error(["generate", "--prompt", "hi", "--ea-model", folder],
                                                               capsys, "head-rope")


def _question_file(tmp_path, records) -> Path:
    return _jsonl(tmp_path / "mine.jsonl", records)


# row -> (argv from tmp_path): refused before any model loads
CASES = {
    "head-missing": lambda tmp: ["generate", "--prompt", "hi", "--ea-model", tmp / "nothing"],
    "device": lambda tmp: ["generate", "--prompt", "hi", "--device", "tpu"],
    "seed": lambda tmp: ["bench", "--seed", "1e23"],
    "seed-range": lambda tmp: ["generate", "--prompt", "hi", "--seed", str(10**23)],
    "count": lambda tmp: ["bench", "--max-new-tokens", "0"],
    "temperature": lambda tmp: ["generate", "--prompt", "hi", "--temperature", "nan"],
    "tree-unknown": lambda tmp: ["generate", "--prompt", "hi", "--tree", "nope"],
    "tree-file": lambda tmp: ["generate", "--prompt", "hi", "--tree",
                              (tmp / "t.json").write_text("{no") and tmp / "t.json"],
    "tree-path": lambda tmp: ["generate", "--prompt", "hi", "--tree",
                              (tmp / "t.json").write_text("[[0], [true]]") and tmp / "t.json"],
    "tree-clash": lambda tmp: ["generate", "--prompt", "hi", "--tree", (tmp / "tree_configs").mkdir()
                               or (tmp / "tree_configs" / "chain4.json").write_text("[[0]]") and "chain4"],
    "tree-built-in-name": lambda tmp: ["generate", "--prompt", "hi", "--tree", (tmp / "tree_configs").mkdir()
                                       or (tmp / "tree_configs" / "chain2.json").write_text("[[0],[1]]") and "chain2"],
    "tree-lookup-twice": lambda tmp: ["generate", "--prompt", "hi", "--tree", "chain2+lookup2+lookup"],
    "tree-digits": lambda tmp: ["generate", "--prompt", "hi", "--tree", "chain\u00b2"],
    "tree-nested": lambda tmp: ["generate", "--prompt", "hi", "--tree",
                                (tmp / "t.json").write_text("[" * 100000) and tmp / "t.json"],
    "trees-twice": lambda tmp: ["benchmark", "--trees", "chain2", "chain2"],
    "temperatures-twice": lambda tmp: ["benchmark", "--temperatures", "0.1,0.1000001"],
    "drafter-unknown": lambda tmp: ["generate", "--prompt", "hi", "--drafter", "nope"],
    "pair-lossy": lambda tmp: ["generate", "--prompt", "hi", "--drafter", "with_replacement", "--verifier", "rrs_wo"],
    "drafter-fit": lambda tmp: ["generate", "--prompt", "hi", "--tree", "chain3", "--drafter", "spechub",
                                "--verifier", "spechub"],
    "dynamic-option": lambda tmp: ["generate", "--prompt", "hi", "--total-tokens", "16"],
    "method-option": lambda tmp: ["generate", "--prompt", "hi", "--method", "baseline", "--drafter", "greedy",
                                  "--verifier", "greedy"],
    "acceptance-pq": lambda tmp: ["acceptance", "--p", "[0.5, 0.5]", "--q", "x"],
    "acceptance-range": lambda tmp: ["acceptance", "--p", "[1e308, 1e308]", "--q", "[0.5, 0.5]"],
    "acceptance-subnormal": lambda tmp: ["acceptance", "--p", "[1e-320, 1]", "--q", "[1, 1e-320]"],
    "question-id": lambda tmp: ["bench", "--bench", _question_file(tmp, [{"question_id": [1], "turns": ["A?"]}])],
    "question-category": lambda tmp: ["bench", "--bench", _question_file(tmp, [{"category": {"a": 1},
                                                                                 "turns": ["A?"]}])],
    "question-turns": lambda tmp: ["bench", "--bench", _question_file(tmp, [{"turns": [1, 2]}])],
    "question-category-cell": lambda tmp: ["bench", "--bench", _question_file(tmp, [{"category": "a|b\n# x",
                                                                                     "turns": ["A?"]}])],
    "model-id-cell": lambda tmp: ["bench", "--method", "baseline", "--model-id", "tiny|v2"],
    "report-label-cell": lambda tmp: ["report", _jsonl(tmp / "a.jsonl", [_row(81)]), "--labels", "x|y", "--out",
                                      tmp / "r"],
    "question-json": lambda tmp: ["bench", "--bench", (tmp / "q.jsonl").write_text("{cut\n") and tmp / "q.jsonl"],
    "question-folder": lambda tmp: ["bench", "--bench", (tmp / "d.jsonl").mkdir() or tmp / "d.jsonl"],
    "question-range": lambda tmp: ["bench", "--question-begin", "5", "--question-end", "2"],
    "question-negative": lambda tmp: ["bench", "--question-begin", "-1"],
    "tree-option-twice": lambda tmp: ["generate", "--prompt", "hi", "--tree", "eagle2:depth=2,depth=3"],
    "tree-lookup-size": lambda tmp: ["generate", "--prompt", "hi", "--tree", "chain2+lookup5000"],
    "check-rows": lambda tmp: ["check-greedy", "--trees", "chain2", "--dtypes", "float32", "--questions", "1", "--out",
                               _jsonl(tmp / f"greedy_check_{datetime.date.today()}.jsonl", [[1, 2]]).parent],
    "check-trees-twice": lambda tmp: ["check-greedy", "--trees", "chain2", "chain2", "--out", tmp],
    "answer-field": lambda tmp: ["report", _jsonl(tmp / "a.jsonl", [_row(81, wall_time=("1.0",))]),
                                 "--out", tmp / "r"],
    "answer-lengths": lambda tmp: ["report", _jsonl(tmp / "a.jsonl", [_row(81, new_tokens=[4, 4])]),
                                   "--out", tmp / "r"],
    "answer-tokens": lambda tmp: ["report", _jsonl(tmp / "a.jsonl", [_row(81, new_tokens=[10**400])]),
                                  "--out", tmp / "r"],
    "answer-accepted": lambda tmp: ["report", _jsonl(tmp / "a.jsonl", [_row(81, accept_lengths=[10**9])]),
                                    "--out", tmp / "r"],
    "answer-seconds": lambda tmp: ["report", _jsonl(tmp / "a.jsonl", [_row(81, wall_time=(1e308,))]),
                                   "--out", tmp / "r"],
    "answer-no-time": lambda tmp: ["report", _jsonl(tmp / "a.jsonl", [_row(81, wall_time=(0.0,))]),
                                   "--out", tmp / "r"],
    "report-disjoint": lambda tmp: ["report", _jsonl(tmp / "a.jsonl", [_row(81)]), "--baseline",
                                    _jsonl(tmp / "b.jsonl", [_row(1081)]), "--out", tmp / "r"],
    "bench-core-out": lambda tmp: ["bench-core", "--max-drafts", "2", "--out",
                                   (tmp / f"core_bench_{datetime.date.today()}.md").write_text("x") and tmp],
    "answer-twice": lambda tmp: ["report", _jsonl(tmp / "a.jsonl", [_row(81), _row(81)]), "--out", tmp / "r"],
    "answer-not-utf8": lambda tmp: ["report", (tmp / "a.jsonl").write_bytes(b"\xff\xfe{}\n") and tmp / "a.jsonl",
                                    "--out", tmp / "r"],
    "answer-empty": lambda tmp: ["report", tmp / "none.jsonl", "--out", tmp / "r"],
    "answer-folder": lambda tmp: ["bench", "--question-end", "1", "--answer-file", tmp],
    "report-mixed": lambda tmp: ["report", _jsonl(tmp / "a.jsonl", [_row(81, settings={"temperature": 0.0}),
                                                                    _row(91, settings={"temperature": 1.0})]),
                                 "--out", tmp / "r"],
    "benchmark-option": lambda tmp: ["benchmark", "--methods", "baseline", "--trees", "chain2"],
    "temperatures-empty": lambda tmp: ["benchmark", "--temperatures", " , "],
    "sweep-pairs": lambda tmp: ["sweep", "--trees", "chain2", "--pairs", "spechub/spechub"],
    "stage-option": lambda tmp: ["train-head", "export", "--epochs", "2"],
    "openers-file": lambda tmp: ["train-head", "prompts", "--run", tmp / "run", "--openers", tmp / "missing.txt"],
    "export-untrained": lambda tmp: ["train-head", "export", "--run", (tmp / "run").mkdir() or tmp / "run"],
    "sequoia-name": lambda tmp: ["sequoia", "--name", "a/b"],
}


@covers(*CASES)
@pytest.mark.parametrize("row", CASES)
def test_bad_input_is_one_line_before_the_model_loads(row, tmp_path, no_model, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    one_line_error(CASES[row](tmp_path), capsys, row)


@covers("report-mixed")
def test_report_averages_several_settings_only_when_asked(tmp_path, capsys):
    answers = _jsonl(tmp_path / "a.jsonl", [_row(81, settings={"temperature": 0.0}),
                                            _row(91, settings={"temperature": 1.0})])
    line = one_line_error(["report", answers, "--out", tmp_path / "r"], capsys, "report-mixed")
    assert "temperature 0.0 -> 1.0" in line and not (tmp_path / "r.md").exists()
    assert run(["report", answers, "--out", tmp_path / "r", "--mixed-settings"], capsys)[0] == 0
    old = _jsonl(tmp_path / "old.jsonl", [_row(81), _row(91)])  # rows from before rows recorded settings
    assert run(["report", old, "--out", tmp_path / "old"], capsys)[0] == 0
    assert "| m | 2 |" in (tmp_path / "old.md").read_text()


@covers("device-no-gpu")
def test_a_cuda_device_without_a_gpu_is_refused_before_loading(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained",
                        lambda *args, **kwargs: pytest.fail("the model loaded"))
    one_line_error(["generate", "--prompt", "hi", "--ea-model", "random", "--device", "cuda"], capsys,
                   "device-no-gpu")


@covers("hub-offline")
def test_a_bare_hub_id_with_a_random_head_offline_fails_at_once(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens there
    started = time.monotonic()
    one_line_error(["generate", "--prompt", "hi", "--base-model", "eagle-mdsd-no-such-model", "--ea-model",
                    "random"], capsys, "hub-offline")
    assert time.monotonic() - started < 5  # the hub client's retries took 25 s


@covers("base-config")
def test_a_base_model_whose_config_is_broken_names_the_file(tiny_chat, tmp_path, capsys):
    broken = tmp_path / "base"
    shutil.copytree(tiny_chat, broken)
    (broken / "config.json").write_text("{not json")
    line = one_line_error(["generate", "--prompt", "w1", "--base-model", broken, "--ea-model", "random"], capsys,
                          "base-config")
    assert str(broken / "config.json") in line


@covers("head-fit", "context", "context-peer")
def test_what_needs_the_model_is_one_line_too(tiny_chat, head_folder, tmp_path, capsys):
    one_line_error(["generate", "--prompt", "w1", "--base-model", tiny_chat, "--ea-model", head_folder], capsys,
                   "head-fit")
    one_line_error(["generate", "--prompt", "w1", "--base-model", tiny_chat, "--ea-model", "random",
                    "--max-new-tokens", "1000"], capsys, "context")
    for method in ("hf_generate", "prompt_lookup"):  # transformers' generate answered garbage past the context
        one_line_error(["generate", "--prompt", "w1", "--base-model", tiny_chat, "--method", method,
                        "--max-new-tokens", "1000"], capsys, "context-peer")
    one_line_error(["check-greedy", "--base-model", tiny_chat, "--trees", "baseline", "--dtypes", "float32",
                    "--questions", "1", "--max-new-tokens", "100000", "--out", tmp_path], capsys, "context-peer")


@covers("head-not-finite")
def test_a_head_with_nan_weights_is_refused(tiny_chat, tmp_path, capsys):
    from transformers import LlamaForCausalLM

    folder = head.save_head(head.random_head(LlamaForCausalLM.from_pretrained(tiny_chat)), tmp_path / "head",
                            safetensors=True)
    _rewrite_weights(lambda state: state["fc.weight"].mul_(float("nan")))(folder)
    line = one_line_error(["generate", "--prompt", "w1", "--base-model", tiny_chat, "--ea-model", folder], capsys,
                          "head-not-finite")
    assert "fc.weight" in line


@covers("ctrl-c-generate")
def test_ctrl_c_in_generate_is_one_line(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "load_target", interrupted)
    code, err = run(["generate", "--prompt", "hi", "--ea-model", "random"], capsys)
    assert code == 130 and err.count("\n") == 1 and says("ctrl-c-generate") in err and "Traceback" not in err


def _bench(tiny_chat, answers, *options):
    return ["bench", "--base-model", tiny_chat, "--method", "baseline", "--question-end", "1", "--max-new-tokens",
            "2", "--answer-file", answers, *options]


@covers("answer-settings", "row-settings", "answer-questions", "answer-question-edited")
def test_an_answer_file_takes_rows_of_its_own_settings_only(tiny_chat, tmp_path, capsys):
    answers = tmp_path / "a.jsonl"
    assert run(_bench(tiny_chat, answers), capsys)[0] == 0
    before = answers.read_bytes()
    row = json.loads(before)
    assert row["settings"] == {"method": "baseline", "temperature": 0.0, "max_new_tokens": 2, "seed": 0,
                               "turns": None, "dtype": "bfloat16", "base_model": str(tiny_chat)}
    assert {"question_id", "answer_id", "model_id", "category", "choices", "tstamp"} <= set(row)  # as before
    line = one_line_error(_bench(tiny_chat, answers, "--temperature", "1", "--question-end", "2"), capsys,
                          "answer-settings")
    assert str(answers) in line and answers.read_bytes() == before
    one_line_error(_bench(tiny_chat, answers, "--max-new-tokens", "3"), capsys)
    assert answers.read_bytes() == before
    assert run(_bench(tiny_chat, answers, "--question-end", "2"), capsys)[0] == 0  # the same settings append
    assert [r["question_id"] for r in bench.read_rows(answers)] == [81, 82]
    mine = _jsonl(tmp_path / "q.jsonl", [{"question_id": 81, "category": "mine", "turns": ["Name a color."]}])
    line = one_line_error(_bench(tiny_chat, answers, "--bench", mine), capsys, "answer-questions")
    assert 'questions null -> "q.jsonl"' in line and bench.read_rows(answers)[0]["category"] == "writing"
    # the same question file, edited: its answered question is not taken as answered for the new text
    mine_answers = tmp_path / "mine.jsonl"
    assert run(_bench(tiny_chat, mine_answers, "--bench", mine), capsys)[0] == 0
    _jsonl(mine, [{"question_id": 81, "category": "mine", "turns": ["Name a fruit."]},
                  {"question_id": 82, "category": "mine", "turns": ["Name a tree."]}])
    before = mine_answers.read_bytes()
    line = one_line_error(_bench(tiny_chat, mine_answers, "--bench", mine), capsys, "answer-question-edited")
    assert "question 81" in line and mine_answers.read_bytes() == before


@covers("context-question")
def test_a_question_past_the_context_is_refused_before_the_first_answer(tiny_chat, tmp_path, capsys):
    answers = tmp_path / "a.jsonl"
    mine = _jsonl(tmp_path / "q.jsonl", [{"question_id": 1, "turns": ["w1 w2"]},
                                          {"question_id": 2, "turns": [" ".join(["w3"] * 300)]}])
    line = one_line_error(["bench", "--base-model", tiny_chat, "--method", "baseline", "--bench", mine,
                           "--max-new-tokens", "2", "--answer-file", answers], capsys, "context-question")
    assert line.startswith("eagle-mdsd: error: question 2:") and not answers.exists()


@covers("answer-tree-edited")
def test_an_answer_file_refuses_rows_of_a_tree_file_since_edited(tiny_chat, tmp_path, capsys):
    answers, tree_file = tmp_path / "a.jsonl", tmp_path / "t.json"
    tree_file.write_text("[[0], [0, 0]]")
    eagle = ["--method", "eagle", "--ea-model", "random", "--tree", tree_file]
    assert run(_bench(tiny_chat, answers, *eagle), capsys)[0] == 0
    tree_file.write_text("[[0], [1], [0, 0]]")  # the same label, another tree
    before = answers.read_bytes()
    line = one_line_error(_bench(tiny_chat, answers, *eagle, "--question-end", "2"), capsys, "answer-tree-edited")
    assert str(answers) in line and answers.read_bytes() == before


@covers("sweep-other-bench")
def test_a_sweep_s_rows_record_their_bench_so_a_resume_on_another_is_refused(tmp_path):
    from eagle_mdsd.benchmark import plans, sweep

    def settings(bench_name):
        plan = plans.SweepPlan(trees=("chain2",), pairs=(("topk", "topk"),), temperatures=(0.0,),
                               bench_name=bench_name)
        topologies, cells = plans.sweep_cells(plan)
        files, row_settings = sweep.cell_files(tmp_path, plan, cells, None, topologies)
        return files[cells[0]], row_settings[cells[0]]

    answers, made = settings("mt_bench")
    _jsonl(answers, [_row(81, settings=made.record())])
    answers, other = settings("translation")
    with pytest.raises(errors.UsageError, match=re.escape(says("sweep-other-bench"))):
        bench.check_answer_file(answers, other, [{"question_id": 81, "turns": ["t"]}])


@covers("page-dotted-name")
def test_a_name_with_a_dot_names_its_pages_whole(tmp_path, capsys):
    from eagle_mdsd.benchmark import pages

    assert pages.benchmark_pages(tmp_path / "t.1", [0.0])[:2] == [tmp_path / "t.1.md", tmp_path / "t.1.json"]
    answers = _jsonl(tmp_path / "a.jsonl", [_row(81)])
    for out in ("report.v1", "report.v2", "report.v3.md"):
        assert run(["report", answers, "--out", tmp_path / out], capsys)[0] == 0
    assert {p.name for p in tmp_path.glob("report*.md")} == {"report.v1.md", "report.v2.md", "report.v3.md"}


@covers("draft-vocab-ranking")
def test_a_draft_vocabulary_past_the_head_s_ranking_is_refused(tiny_chat, tmp_path, capsys):
    target, _ = models.load_target(str(tiny_chat), torch.float32)
    folder = head.save_head(head.random_head(target), tmp_path / "head", safetensors=True)
    (folder / "draft_vocab.json").write_text(json.dumps({"token_ids": list(range(2, 12))}))
    line = one_line_error(["generate", "--base-model", tiny_chat, "--ea-model", folder, "--prompt", "w1 w2",
                           "--max-new-tokens", "2", "--draft-vocab", "50"], capsys, "draft-vocab-ranking")
    assert "(10 tokens)" in line


def _tiny_benchmark(monkeypatch, tiny_chat):
    real = models.load_target
    monkeypatch.setattr(models, "load_target", lambda spec=None, dtype=torch.float32, device="cpu":
                        real(str(tiny_chat), dtype, device))


def _benchmark(tmp_path, *options):
    return ["benchmark", "--methods", "baseline", "--temperatures", "0", "--max-new-tokens", "2",
            "--answers", tmp_path / "answers", "--out", tmp_path / "pages", *options]


@covers("ctrl-c-benchmark")
def test_ctrl_c_in_a_benchmark_names_the_resume_command_that_finishes_it(monkeypatch, tiny_chat, tmp_path, capsys):
    _tiny_benchmark(monkeypatch, tiny_chat)
    answer, calls = bench.answer, []

    def interrupted_on_the_second(runner, tokenizer, question, *args, **kwargs):
        calls.append(question["question_id"])  # (the untimed warm-up answers a question outside the set first)
        if question["question_id"] == 91:
            raise KeyboardInterrupt
        return answer(runner, tokenizer, question, *args, **kwargs)

    monkeypatch.setattr(bench, "answer", interrupted_on_the_second)
    code, err = run(_benchmark(tmp_path, "--questions", "3", "--name", "r"), capsys)
    assert 81 in calls
    lines = [line for line in err.splitlines() if line.strip() and "it/s" not in line and "%|" not in line]
    assert code == 130 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("eagle-mdsd: interrupted: 1 of 3 questions") and says("ctrl-c-benchmark") in lines[0]
    (answers,) = (tmp_path / "answers" / "r").glob("*.jsonl")
    assert [r["question_id"] for r in bench.read_rows(answers)] == [81]  # whole lines only
    assert not (tmp_path / "pages" / "r.md").exists()
    command = re.search(r"continue with `([^`]+)`", lines[0]).group(1)
    assert "--resume r" in command and "--name" not in command
    monkeypatch.setattr(bench, "answer", answer)
    assert run(shlex.split(command)[1:], capsys)[0] == 0
    assert [r["question_id"] for r in bench.read_rows(answers)] == [81, 91, 101]
    assert "Questions: mt_bench 81, 91, 101" in (tmp_path / "pages" / "r.md").read_text()


@covers("resumed-page", "run-exists", "page-exists", "settings-json")
def test_a_resumed_run_describes_its_table_and_fresh_runs_never_overwrite(monkeypatch, tiny_chat, tmp_path, capsys):
    _tiny_benchmark(monkeypatch, tiny_chat)
    assert run(_benchmark(tmp_path, "--questions", "3", "--name", "r"), capsys)[0] == 0
    assert run(_benchmark(tmp_path, "--questions", "1", "--resume", "r"), capsys)[0] == 0
    assert says("resumed-page") in (tmp_path / "pages" / "r.md").read_text()  # not question 81 alone
    pages = {p: p.read_bytes() for p in (tmp_path / "pages").iterdir()}
    monkeypatch.setattr(models, "load_target", lambda *args, **kwargs: pytest.fail("the model loaded"))
    one_line_error(_benchmark(tmp_path, "--name", "r"), capsys, "run-exists")
    shutil.rmtree(tmp_path / "answers" / "r")  # the answers gone, the page still there
    one_line_error(_benchmark(tmp_path, "--name", "r"), capsys, "page-exists")
    assert not (tmp_path / "answers" / "r").exists()
    assert {p: p.read_bytes() for p in (tmp_path / "pages").iterdir()} == pages
    (tmp_path / "answers" / "s").mkdir(parents=True)
    (tmp_path / "answers" / "s" / "settings.json").write_text("{cut")
    line = one_line_error(_benchmark(tmp_path, "--resume", "s"), capsys, "settings-json")
    assert str(tmp_path / "answers" / "s" / "settings.json") in line


@covers("resume-kind", "resume-not-run")
def test_a_run_resumes_only_under_the_command_that_made_it(monkeypatch, tmp_path, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "load_target", interrupted)  # a fresh sweep stopped while its model loads
    sweep = ["sweep", "--trees", "chain2", "--pairs", "topk/topk", "--answers", tmp_path / "answers", "--out",
             tmp_path / "pages"]
    assert run([*sweep, "--name", "s"], capsys)[0] == 130
    assert json.loads((tmp_path / "answers" / "s" / "settings.json").read_text()) == {"kind": "sweep"}
    monkeypatch.setattr(models, "load_target", lambda *args, **kwargs: pytest.fail("the model loaded"))
    for resume in ("s", tmp_path / "answers" / "s"):
        line = one_line_error(_benchmark(tmp_path, "--resume", resume), capsys, "resume-kind")
        assert "eagle-mdsd sweep --resume" in line
    (tmp_path / "answers" / "b").mkdir()
    (tmp_path / "answers" / "b" / "settings.json").write_text(json.dumps({"kind": "benchmark"}))
    assert "is a benchmark run, not a sweep run" in one_line_error([*sweep, "--resume", "b"], capsys)
    (tmp_path / "plain").mkdir()  # a folder no run made: it was run into, its page beside it, exit 0
    for command in (sweep, _benchmark(tmp_path)):
        one_line_error([*command, "--resume", tmp_path / "plain"], capsys, "resume-not-run")
    assert not any((tmp_path / "plain").iterdir())


@covers("baseline-page")
def test_a_page_without_eagle_describes_no_tree(monkeypatch, tiny_chat, tmp_path, capsys):
    _tiny_benchmark(monkeypatch, tiny_chat)
    assert run(_benchmark(tmp_path, "--questions", "1", "--name", "b"), capsys)[0] == 0
    page = (tmp_path / "pages" / "b.md").read_text()
    assert not [word for word in ("EAGLE:", "EAGLE and", "tree", "drafter", "verifier") if word in page], page
    assert says("baseline-page") in page


@covers("run-race")
def test_two_runs_with_one_name_never_share_a_folder(monkeypatch, tmp_path, capsys):
    """The name is checked first; the other run makes the folder while this one reads its questions."""
    load = questions.load

    def other_run_starts(*args, **kwargs):
        (tmp_path / "answers" / "r").mkdir(parents=True, exist_ok=True)
        (tmp_path / "answers" / "r" / "theirs.jsonl").write_text("")
        return load(*args, **kwargs)

    monkeypatch.setattr(questions, "load", other_run_starts)
    monkeypatch.setattr(models, "load_target", lambda *args, **kwargs: pytest.fail("the model loaded"))
    one_line_error(_benchmark(tmp_path, "--name", "r"), capsys, "run-race")
    assert [p.name for p in (tmp_path / "answers" / "r").iterdir()] == ["theirs.jsonl"]


@covers("sequoia-out")
def test_sequoia_writes_to_runs_by_default(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    written = []
    monkeypatch.setattr(models, "load_target", lambda *args, **kwargs: (None, None))
    monkeypatch.setattr(head, "load_head", lambda *args, **kwargs: None)
    monkeypatch.setattr(models, "eos_token_ids", lambda *args: [])
    monkeypatch.setattr(sequoia, "build", lambda decoder_for, tokenizer, out, *args: written.append(out) or {
        "description": "", "acceptance": [], "visits": 0})
    assert run(["sequoia", "--name", "mine"], capsys)[0] == 0
    assert written == [Path("runs") / "sequoia" / "mine.json"] and says("sequoia-out").startswith("runs/sequoia/")


def test_every_row_of_the_doc_has_a_test_and_every_test_a_row():
    rows = doc_rows()
    assert sorted(set(rows) - COVERED) == [], "rows of docs/bad-input.md without a test"
    assert sorted(COVERED - set(rows)) == [], "tests of rows docs/bad-input.md does not list"
    assert all(rows[row] for row in rows), "a row without a quoted error text"


# Second round: one writer per run, SIGTERM, writes that fail, bytes that are not UTF-8, comparisons that cannot be
# made.  (New modules are imported inside the tests.)

def _utf8_question_file(tmp):
    (tmp / "q.jsonl").write_text('{"turns": ["fine", "then \\udcff"]}\n')
    return tmp / "q.jsonl"


CASES_2 = {
    "answer-device": lambda tmp: ["bench", "--method", "baseline", "--answer-file", "/dev/null"],
    "prompt-bytes": lambda tmp: ["generate", "--prompt", "caf\udcc3 \udcff", "--ea-model", "random"],
    "prompt-blank": lambda tmp: ["generate", "--prompt", " ", "--ea-model", "random"],
    "question-bytes": lambda tmp: ["bench", "--method", "baseline", "--bench", _utf8_question_file(tmp)],
}


@covers(*CASES_2)
@pytest.mark.parametrize("row", CASES_2)
def test_odd_bytes_and_odd_files_are_one_line_before_the_model_loads(row, tmp_path, no_model, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(CASES_2[row](tmp_path), capsys, row)
    assert "\udcff" not in line
    if row == "question-bytes":
        assert f"{tmp_path / 'q.jsonl'} line 1, turn 2" in line
    assert not list(tmp_path.glob("runs"))  # nothing made


@covers("read-device")
def test_reading_a_device_or_a_pipe_as_an_answer_file_is_refused_without_reading_it(tmp_path):
    """A pipe nobody writes blocks whoever opens it, and /dev/full reads without end: both are refused unopened
    (a real process, so that a hang is a timeout here)."""
    import os
    import subprocess
    import sys

    pipe = tmp_path / "a.jsonl"
    os.mkfifo(pipe)
    for answers in (pipe, "/dev/full"):
        done = subprocess.run([sys.executable, "-m", "eagle_mdsd.cli", "report", str(answers), "--out",
                               str(tmp_path / "r")], capture_output=True, text=True, timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and says("read-device") in lines[0], done.stderr
        assert str(answers) in lines[0]


@covers("hub-endpoint")
def test_an_hf_endpoint_that_is_no_url_is_one_line_before_the_imports_read_it():
    import os
    import subprocess
    import sys

    for endpoint in ("https://hf.example:notaport", "http://[bad"):
        done = subprocess.run([sys.executable, "-m", "eagle_mdsd.cli", "pairs"], capture_output=True, text=True,
                              timeout=120, env=os.environ | {"HF_ENDPOINT": endpoint})
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and says("hub-endpoint") in lines[0], done.stderr


@covers("embedded-copy-damaged")
def test_a_damaged_copy_of_the_embedded_model_says_to_delete_it(tmp_path, monkeypatch, capsys):
    copy = tmp_path / "smollm2-135m-instruct"
    copy.mkdir()
    (copy / "config.json").write_text(json.dumps({"model_type": "llama"}))  # the weights gone
    monkeypatch.setenv("EAGLE_MDSD_CACHE", str(tmp_path))
    line = one_line_error(["generate", "--prompt", "hi", "--max-new-tokens", "2"], capsys, "embedded-copy-damaged")
    assert str(copy) in line


def _full_disk(monkeypatch):
    """Every os.write fails as on a full disk."""
    import errno
    import os

    def full(descriptor, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)


@covers("disk-full-report")
def test_a_full_disk_under_a_report_keeps_the_earlier_page_and_leaves_no_file(tmp_path, monkeypatch, capsys):
    answers = _jsonl(tmp_path / "a.jsonl", [_row(81), _row(91)])
    (tmp_path / "r.md").write_text("# the earlier page\n")
    _full_disk(monkeypatch)
    line = one_line_error(["report", answers, "--out", tmp_path / "r"], capsys, "disk-full-report")
    assert str(tmp_path / "r.") in line and "No space left on device" in line
    assert (tmp_path / "r.md").read_text() == "# the earlier page\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "r.md"]


@covers("disk-full-answers")
def test_a_full_disk_under_bench_leaves_no_empty_answer_file(tiny_chat, tmp_path, monkeypatch, capsys):
    answers = tmp_path / "a.jsonl"
    _full_disk(monkeypatch)
    line = one_line_error(_bench(tiny_chat, answers), capsys, "disk-full-answers")
    assert str(answers) in line and not answers.exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # nor a lock file


@covers("read-only-folder")
def test_a_folder_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, capsys):
    import errno
    import tempfile

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    answers = _jsonl(tmp_path / "a.jsonl", [_row(81)])
    monkeypatch.setattr(tempfile, "mkstemp", refused)
    line = one_line_error(["report", answers, "--out", tmp_path / "ro" / "r"], capsys, "read-only-folder")
    assert f"cannot write {tmp_path / 'ro' / 'r'}" in line and "Permission denied" in line


@covers("cache-unwritable", "cache-fallback")
def test_an_unwritable_cache_falls_back_to_the_temp_folder_or_names_the_variables(tiny_chat, tmp_path, monkeypatch,
                                                                                  capsys):
    import errno
    import tempfile

    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.delenv("EAGLE_MDSD_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home" / ".cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(models, "_convert_embedded", lambda: (AutoModelForCausalLM.from_pretrained(tiny_chat),
                                                              AutoTokenizer.from_pretrained(tiny_chat)))
    make_folder, unwritable = tempfile.mkdtemp, [tmp_path / "home"]

    def read_only(*args, dir=None, **kwargs):
        if any(Path(dir).is_relative_to(place) for place in unwritable):
            raise PermissionError(errno.EACCES, "Permission denied")
        return make_folder(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    folder = models._embedded_folder()
    assert folder.is_relative_to(tmp_path / "tmp") and (folder / "config.json").exists()
    assert says("cache-fallback") in capsys.readouterr().err
    assert models._embedded_folder() == folder  # found there next time
    shutil.rmtree(folder)
    unwritable.append(tmp_path / "tmp")
    line = one_line_error(["generate", "--prompt", "hi", "--ea-model", "random", "--max-new-tokens", "1"], capsys,
                          "cache-unwritable")
    assert str(tmp_path / "home" / ".cache" / "eagle-mdsd") in line


@covers("report-unlike", "report-across")
def test_report_refuses_a_speedup_over_answers_made_otherwise_unless_asked(tmp_path, capsys):
    alike = {"method": "eagle", "temperature": 0.0, "max_new_tokens": 128, "base_model": "embedded"}
    eagle = _jsonl(tmp_path / "eagle.jsonl", [_row(81, settings=alike), _row(91, settings=alike)])
    base = _jsonl(tmp_path / "base.jsonl", [_row(81, settings=alike | {"method": "baseline", "base_model": "gpt2"}),
                                            _row(91, settings=alike | {"method": "baseline", "base_model": "gpt2"})])
    line = one_line_error(["report", eagle, "--baseline", base, "--out", tmp_path / "r"], capsys, "report-unlike")
    assert "differ in base_model (embedded against gpt2)" in line and "--across base_model" in line
    assert not (tmp_path / "r.md").exists()
    assert run(["report", eagle, "--baseline", base, "--out", tmp_path / "r", "--across", "base_model"], capsys)[0] == 0
    assert says("report-across") in (tmp_path / "r.md").read_text()
    other_bench = _jsonl(tmp_path / "other.jsonl", [_row(81, settings=alike | {"method": "baseline"}) | {
        "category": "coding"}])
    line = one_line_error(["report", eagle, "--baseline", other_bench, "--out", tmp_path / "s"], capsys)
    assert "differ in bench (question 81 in writing against in coding)" in line
    same = _jsonl(tmp_path / "same.jsonl", [_row(81, settings=alike | {"method": "baseline"})])
    assert run(["report", eagle, "--baseline", same, "--out", tmp_path / "t"], capsys)[0] == 0
    assert "Not alike" not in (tmp_path / "t.md").read_text()


@covers("answer-locked")
def test_a_second_writer_of_an_answer_file_is_told_who_holds_it(tiny_chat, tmp_path, capsys):
    import os

    from eagle_mdsd import locks

    answers = tmp_path / "a.jsonl"
    with locks.held(answers, "answer file", "run again"):
        line = one_line_error(_bench(tiny_chat, answers), capsys, "answer-locked")
    assert f"process {os.getpid()}" in line and not answers.exists()
    assert run(_bench(tiny_chat, answers), capsys)[0] == 0  # once it ends
    assert [p.name for p in tmp_path.iterdir()] == ["a.jsonl"]  # the lock file gone with it


@covers("train-run-locked", "train-all")
def test_one_train_head_stage_writes_a_run_at_a_time_and_all_stages_end_in_export(tmp_path, monkeypatch, capsys):
    import os

    from eagle_mdsd import locks, training

    done = []
    monkeypatch.setattr(training, "self_prompts", lambda run, *args, **kwargs: pytest.fail("the stage ran"))
    with locks.held(tmp_path / "run", "run", "run again"):
        line = one_line_error(["train-head", "prompts", "--run", tmp_path / "run"], capsys, "train-run-locked")
    assert f"process {os.getpid()}" in line
    monkeypatch.setattr(training, "make_data", lambda *args, **kwargs: done.append("data") or [])
    monkeypatch.setattr(training, "train", lambda *args, **kwargs: done.append("train") or {"log": [], "step": 0})
    monkeypatch.setattr(training, "export", lambda run, to, *args, **kwargs: done.append("export") or to)
    assert cli.main(["train-head", "all", "--run", str(tmp_path / "run")]) == 0
    assert done == ["data", "train", "export"] and says("train-all") in capsys.readouterr().out
    assert not (tmp_path / ".run.lock").exists()


@covers("run-locked", "sigterm-benchmark")
def test_two_processes_on_one_run_one_answers_and_the_other_is_refused(tmp_path):
    """Two real processes: the first answers run r, the second (`--resume r`) is refused naming the first; SIGTERM
    then stops the first with Ctrl-C's line and the command that continues."""
    import signal
    import subprocess
    import sys

    def benchmark(*options):
        return [sys.executable, "-m", "eagle_mdsd.cli", "benchmark", "--methods", "baseline", "--temperatures", "0",
                "--questions", "8", "--max-new-tokens", "128", "--answers", str(tmp_path), "--out", str(tmp_path),
                *options]

    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(benchmark("--name", "r"), stdout=subprocess.DEVNULL, stderr=log)
    lock = tmp_path / ".r.lock"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and first.poll() is None and not (
            lock.exists() and lock.read_text().strip() == str(first.pid)):
        time.sleep(0.05)
    try:
        second = subprocess.run(benchmark("--resume", "r"), capture_output=True, text=True, timeout=300)
        assert first.poll() is None, "the first run ended before the second started"
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=300)
        log.close()
    err = (tmp_path / "first.log").read_text()
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(lines) == 1 and says("run-locked") in lines[0], second.stderr
    assert f"process {first.pid}" in lines[0]
    stopped = [line for line in err.splitlines() if line.startswith("eagle-mdsd")]
    assert first.returncode == 130 and len(stopped) == 1 and "Traceback" not in err, err
    assert says("sigterm-benchmark") in stopped[0] and "--resume r" in stopped[0]
    for answers in (tmp_path / "r").glob("*.jsonl"):
        bench.read_rows(answers)  # no question twice
    assert not lock.exists()


def _sigterm(*args, **kwargs):
    import os
    import signal

    os.kill(os.getpid(), signal.SIGTERM)


SIGTERM_CASES = {  # command -> (argv from tmp_path and tiny_chat, what sends SIGTERM)
    "bench": (lambda tmp, tiny: _bench(tiny, tmp / "a.jsonl", "--question-end", "2"), (bench, "answer")),
    "sweep": (lambda tmp, tiny: ["sweep", "--trees", "chain2", "--pairs", "topk/topk", "--answers", tmp, "--out", tmp,
                                 "--name", "s"], (models, "load_target")),
    "train-head": (lambda tmp, tiny: ["train-head", "prompts", "--run", tmp / "run"], ("training", "self_prompts")),
}


@covers("sigterm")
@pytest.mark.parametrize("command", SIGTERM_CASES)
def test_sigterm_ends_like_ctrl_c(command, tiny_chat, tmp_path, monkeypatch, capsys):
    import signal

    from eagle_mdsd import training

    argv, (owner, name) = SIGTERM_CASES[command]
    monkeypatch.setattr(training if owner == "training" else owner, name, _sigterm)

    def unhandled(*args):
        raise RuntimeError("SIGTERM was not handled")

    previous = signal.signal(signal.SIGTERM, unhandled)
    try:
        code, err = run(argv(tmp_path, tiny_chat), capsys)
    finally:
        restored = signal.signal(signal.SIGTERM, previous)
    lines = [line for line in err.splitlines() if line.startswith("eagle-mdsd")]
    assert code == 130 and len(lines) == 1 and lines[0].startswith(says("sigterm")), err
    assert restored is unhandled  # the command put the handler back
    if command == "sweep":
        assert "--resume s" in lines[0]


@covers("default-names")
def test_fresh_runs_started_in_one_second_get_two_names(tmp_path):
    import argparse

    from eagle_mdsd.cli import options

    args = argparse.Namespace(answers=str(tmp_path), resume=None, name=None)
    names = {options.run_name(args, "benchmark") for _ in range(20)}
    assert len(names) == 20 and says("default-names").startswith("DATE_HOST_TIME")


@covers("umask")
def test_pages_charts_and_summaries_follow_the_umask(tmp_path, capsys):
    import os
    import stat

    from eagle_mdsd import outputs

    answers = _jsonl(tmp_path / "a.jsonl", [_row(81)])
    previous = os.umask(0o022)
    try:
        assert run(["report", answers, "--out", tmp_path / "r"], capsys)[0] == 0
        written = [tmp_path / "r.md", tmp_path / "r.png", outputs.write_atomically(tmp_path / "s.json", "{}")]
        os.umask(0o027)
        written.append(outputs.write_atomically(tmp_path / "settings.json", "{}"))
    finally:
        os.umask(previous)
    assert [oct(stat.S_IMODE(p.stat().st_mode)) for p in written] == ["0o644"] * 3 + ["0o640"]
    assert says("umask") == "0644 under umask 022"


@covers("device-no-gpu-run")
def test_a_run_on_a_missing_gpu_leaves_no_folder(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for command in ("benchmark", "sweep"):
        one_line_error([command, "--device", "cuda", "--name", "r", "--answers", tmp_path / command, "--out",
                        tmp_path / command], capsys, "device-no-gpu-run")
        assert not (tmp_path / command).exists() or not list((tmp_path / command).iterdir())


@covers("prompts-budget")
def test_the_prompts_stage_stops_before_a_batch_that_would_overrun(tmp_path, monkeypatch):
    """--max-minutes 1.5 with batches of 40 s: two batches, then a third would end at 120 s, so it stops at 80 s."""
    from types import SimpleNamespace

    from eagle_mdsd import training
    from test_training import _embedded_tokenizer, _talkative

    tokenizer = _embedded_tokenizer()
    _talkative(tmp_path / "model", tokenizer, monkeypatch)
    clock = [0.0]
    model = models.load_target()[0]
    generate = model.generate

    def slow_generate(*args, **kwargs):
        clock[0] += 40.0
        return generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", slow_generate)
    fake_time = SimpleNamespace(monotonic=lambda: clock[0])
    for module in ("eagle_mdsd.training.budget", "eagle_mdsd.training.prompts"):
        monkeypatch.setattr(f"{module}.time", fake_time, raising=False)
    training.self_prompts(tmp_path / "run", 10_000, batch_size=4, max_tokens=8, max_minutes=1.5)
    assert clock[0] == 80.0  # (90 s allowed)


HEAD_TOOLS = {  # command -> argv naming a head folder that does not exist
    "sequoia": lambda tmp: ["sequoia", "--ea-model", tmp / "nothing"],
    "check-greedy": lambda tmp: ["check-greedy", "--trees", "chain2", "--ea-model", tmp / "nothing", "--out", tmp],
    "train-head evaluate": lambda tmp: ["train-head", "evaluate", "--run", tmp, "--export-to", tmp / "nothing"],
}


@covers("head-missing-tools")
@pytest.mark.parametrize("command", HEAD_TOOLS)
def test_a_missing_head_is_refused_before_the_model_loads_by_every_command(command, tmp_path, no_model, capsys):
    assert str(tmp_path / "nothing") in one_line_error(HEAD_TOOLS[command](tmp_path), capsys, "head-missing-tools")


@covers("sequoia-empty")
def test_sequoia_writes_no_tree_of_the_root_alone(tmp_path, monkeypatch):
    """An acceptance of 0 at every rank (a head that never matches, a draft vocabulary of 3 tokens) makes the empty
    tree the best; written, it would be refused by every command given it."""
    monkeypatch.setattr(sequoia, "held_out_prompts", lambda tokenizer, count: [[1, 2, 3]])
    monkeypatch.setattr(sequoia, "measure_acceptance", lambda *args: ([0.0] * 8, 3))
    out = tmp_path / "s.json"
    with pytest.raises(errors.UsageError, match=says("sequoia-empty")):
        sequoia.build(lambda topology: None, None, out, max_nodes=1024, max_depth=1, hardware_aware=False)
    assert not out.exists()
    monkeypatch.setattr(sequoia, "measure_acceptance", lambda *args: ([0.5] + [0.0] * 7, 3))
    assert sequoia.build(lambda topology: None, None, out, max_nodes=4, max_depth=2, hardware_aware=False)["paths"]
    assert out.exists()


@covers("batch-memory")
def test_a_batch_whose_kv_cache_cannot_fit_is_refused_before_it_starts(tmp_path, tiny_chat, capsys, monkeypatch):
    from eagle_mdsd.training import budget
    from test_training import _talkative
    from tiny import embedded_tokenizer

    with monkeypatch.context() as patched:  # (free memory as a machine of 64 GiB would have)
        _talkative(tmp_path / "model", embedded_tokenizer(), patched)
        patched.setattr(budget, "free_memory", lambda device: 64 << 30)
        line = one_line_error(["train-head", "prompts", "--run", tmp_path / "p", "--count", 4, "--batch-size", 10**9,
                               "--device", "cpu"], capsys, "batch-memory")
    assert "--batch-size 1000000000: a batch of 1000000000 sequences of up to" in line
    assert re.search(r"use --batch-size \d+ or less$", line)
    assert not (tmp_path / "p" / "self_prompts.jsonl").exists()
    # data: each batch before it starts, its 4 prompts (a shard's, left-padded to the longest) and 8 answer tokens
    # at 128 bytes a token (1 layer, keys and values of 2 heads of 8 in float32), against 3,000 bytes
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 1}"}) + "\n" for i in range(4)))
    monkeypatch.setattr(budget, "free_memory", lambda device: 3000)
    data = ["train-head", "data", "--run", tmp_path / "d", "--base-model", tiny_chat, "--prompts", prompts,
            "--max-new-tokens", 8, "--dtype", "float32", "--device", "cpu"]
    line = one_line_error(data + ["--batch-size", 64], capsys, "batch-memory")
    tokens = int(re.search(r"--batch-size 64: a batch of 4 sequences of up to (\d+) tokens", line).group(1))
    fits = 3000 // (128 * tokens)
    assert 9 <= tokens < 20 and 1 <= fits < 4 and line.endswith(f"use --batch-size {fits} or less")
    assert run(data + ["--batch-size", fits], capsys)[0] == 0  # what the line says fits


@covers("out-of-memory")
@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                   RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8"),
                                   MemoryError()])
def test_a_run_out_of_memory_ends_in_one_line(tmp_path, capsys, monkeypatch, error):
    from eagle_mdsd.training import prompts
    from test_training import _talkative
    from tiny import embedded_tokenizer

    def exhausted(*args, **kwargs):
        raise error

    _talkative(tmp_path / "model", embedded_tokenizer(), monkeypatch)
    monkeypatch.setattr(prompts, "_sampled_messages", exhausted)
    one_line_error(["train-head", "prompts", "--run", tmp_path, "--count", 4, "--device", "cpu"], capsys,
                   "out-of-memory")
    def other(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(prompts, "_sampled_messages", other)  # any other error: a bug, with its traceback
    with pytest.raises(RuntimeError, match="mat1 and mat2"):
        cli.main(["train-head", "prompts", "--run", str(tmp_path), "--count", "4"])


@covers("train-all-up-front")
def test_train_head_all_checks_the_train_options_before_its_data_stage(tiny_chat, tmp_path, monkeypatch, capsys):
    from eagle_mdsd import training

    monkeypatch.setattr(training, "make_data", lambda *a, **k: pytest.fail("the data stage ran before the check"))
    all_stages = ["train-head", "all", "--run", tmp_path / "run", "--base-model", tiny_chat, "--device", "cpu"]
    for option, says_text in ((["--init-from", tmp_path / "none"], "neither a run with checkpoint.pt"),
                              (["--data-from", tmp_path / "none"], "no data shards in"),
                              (["--draft-vocab", "65"], "is more than the target's vocabulary of 64"),
                              (["--format", "eagle3"], "EAGLE-3 needs a target of 4 layers")):
        assert says_text in one_line_error([*all_stages, *option], capsys, "train-all-up-front")


@covers("train-draft-vocab")
def test_a_draft_vocabulary_over_the_targets_is_refused_in_training(tmp_path, capsys):
    from test_training import _tiny_run
    from tiny import embedded_tokenizer

    model = _tiny_run(tmp_path / "run", embedded_tokenizer())
    vocab = len(embedded_tokenizer())
    line = one_line_error(["train-head", "train", "--run", tmp_path / "run", "--base-model", model,
                           "--draft-vocab", vocab + 1, "--device", "cpu"], capsys, "train-draft-vocab")
    assert f"pass at most {vocab}, or 'full'" in line
