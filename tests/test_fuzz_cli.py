"""The command line over generated bad input: malformed files of every kind it reads, odd JSON types, extreme
numbers, missing paths and interrupted runs.

Each example runs `cli.main` in this process; prompts of any bytes and odd paths (pipes, devices, folders, names
of any bytes) are among the inputs.  It must end in one of three ways: exit code 2 with one line on
stderr (bad input), exit code 0, or the point where the model would load (the input was accepted: a stand-in
raises `ModelLoads` there, so no model loads in the loop).  Anything else - a traceback - fails the test.
Outputs written before the command (an answer file, a page) must be byte for byte as they were.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from eagle_mdsd import cli, head, models, outputs, report, validate
from tiny import tiny_target

# A fixed, small set of examples a test in the default suite; EAGLE_MDSD_FUZZ_EXAMPLES=N draws N fresh ones a test.
DEEP = int(os.environ.get("EAGLE_MDSD_FUZZ_EXAMPLES", 0))
EXAMPLES = settings(max_examples=DEEP or 25, deadline=None, derandomize=not DEEP, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class ModelLoads(Exception):
    """Raised where a model would load: the input got past every check made before it."""


@pytest.fixture(autouse=True)
def no_model(monkeypatch):
    def stand_in(*args, **kwargs):
        raise ModelLoads

    monkeypatch.setattr(models, "load_target", stand_in)


def outcome(argv, capsys) -> str:
    """'error' (exit 2, one line), 'done' (exit 0) or 'accepted' (the model would load); else the test fails."""
    capsys.readouterr()
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as stop:
        code = stop.code
    except ModelLoads:
        return "accepted"
    err = capsys.readouterr().err
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("eagle-mdsd"), f"{argv}: {err}"
        return "error"
    assert code == 0, f"{argv}: exit {code}: {err}"
    return "done"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)


def mutated(record: dict):
    """A valid record with one field replaced by any JSON value, or removed, or a line of any JSON value."""
    field = st.sampled_from(sorted(record))
    return st.one_of(
        st.tuples(field, JSON).map(lambda change: record | {change[0]: change[1]}),
        field.map(lambda name: {k: v for k, v in record.items() if k != name}),
        JSON)


def nested_choice(row: dict):
    """An answer row whose choices[0] has one field replaced by any JSON value."""
    choice = row["choices"][0]
    return st.tuples(st.sampled_from(sorted(choice)), JSON).map(
        lambda change: row | {"choices": [choice | {change[0]: change[1]}]})


def line_bytes(records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def cut(data: bytes):
    """The file as a kill could leave it: cut at any byte."""
    return st.integers(0, len(data)).map(lambda n: data[:n])


QUESTION = {"question_id": 1, "category": "writing", "turns": ["Write a poem.", "Shorter."]}
ANSWER = {"question_id": 81, "answer_id": "a", "model_id": "m", "category": "writing", "tstamp": 0.0,
          "choices": [{"index": 0, "turns": ["x", "y"], "new_tokens": [4, 3], "idxs": [2, 2], "wall_time": [1.0, 0.5],
                       "accept_lengths": [2, 2, 1, 2]}], "settings": {"method": "baseline", "temperature": 0.0}}


def files_of_kind(valid: list[dict], field_changes):
    """Bytes of a JSONL file: valid lines with one changed record, arbitrary bytes, or a cut-short file."""
    whole = line_bytes(valid)
    return st.one_of(
        st.tuples(field_changes, st.integers(0, len(valid))).map(
            lambda change: line_bytes(valid[:change[1]] + [change[0]] + valid[change[1]:])),
        st.binary(max_size=40),
        cut(whole))


class Earlier:
    """Files made before a command: they must be untouched by it."""

    def __init__(self, folder: Path):
        self.answers = folder / "earlier.jsonl"
        self.answers.write_bytes(line_bytes([ANSWER]))
        self.page = folder / "earlier.md"
        self.page.write_text("# an earlier page\n")
        self.before = {path: path.read_bytes() for path in (self.answers, self.page)}

    def untouched(self) -> bool:
        return all(path.read_bytes() == data for path, data in self.before.items())


@EXAMPLES
@given(data=files_of_kind([QUESTION, QUESTION | {"question_id": 2}], mutated(QUESTION)))
def test_question_files(data, capsys):
    with tempfile.TemporaryDirectory() as folder:
        folder, earlier = Path(folder), Earlier(Path(folder))
        (folder / "q.jsonl").write_bytes(data)
        outcome(["bench", "--bench", folder / "q.jsonl", "--method", "baseline", "--answer-file", earlier.answers],
                capsys)
        assert earlier.untouched()


@EXAMPLES
@given(data=files_of_kind([ANSWER, ANSWER | {"question_id": 91}], st.one_of(mutated(ANSWER), nested_choice(ANSWER))),
       command=st.sampled_from(["report", "bench"]))
def test_answer_files(data, command, capsys):
    with tempfile.TemporaryDirectory() as folder:
        folder, earlier = Path(folder), Earlier(Path(folder))
        answers = folder / "a.jsonl"
        answers.write_bytes(data)
        if command == "report":
            result = outcome(["report", answers, "--out", folder / "r"], capsys)
            assert result != "accepted" and answers.read_bytes() == data
        else:  # resuming into it: refused, or accepted and not yet written
            outcome(["bench", "--method", "baseline", "--question-end", "2", "--answer-file", answers], capsys)
            assert answers.read_bytes() == data
        assert earlier.untouched()


@pytest.fixture(scope="module")
def head_folder(tmp_path_factory) -> Path:
    return head.save_head(head.random_head(tiny_target(vocab=16, hidden=32)), tmp_path_factory.mktemp("head"),
                          safetensors=True)


@EXAMPLES
@given(file=st.sampled_from(["config.json", "model.safetensors", "draft_vocab.json"]),
       change=st.one_of(st.tuples(st.just("field"), st.text(max_size=24), JSON),
                        st.tuples(st.just("cut"), st.floats(0, 1), st.none()),
                        st.tuples(st.just("bytes"), st.binary(max_size=40), st.none())))
def test_head_folders(head_folder, file, change, capsys):
    import shutil

    kind, first, second = change
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder) / "head"
        shutil.copytree(head_folder, folder)
        path = folder / file
        if kind == "field" and file != "model.safetensors":
            record = json.loads(path.read_text()) if path.exists() else {"token_ids": [0, 1]}
            key = first if first and len(record) > 30 else (sorted(record)[len(first) % len(record)])
            path.write_text(json.dumps(record | {key: second}))
        elif kind == "cut" and path.exists():
            data = path.read_bytes()
            path.write_bytes(data[: int(first * len(data))])
        else:
            path.write_bytes(first if kind == "bytes" else b"")
        outcome(["generate", "--prompt", "hi", "--ea-model", folder], capsys)


@EXAMPLES
@given(data=st.one_of(st.binary(max_size=40), JSON.map(lambda v: json.dumps(v).encode()),
                      mutated({"head": None, "dtype": "bfloat16", "machine": {"cpu": "x", "threads": 1,
                                                                               "torch": "2"}}).map(
                          lambda v: json.dumps(v).encode())))
def test_settings_records(data, capsys):
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "runs" / "r").mkdir(parents=True)
        (folder / "runs" / "r" / "settings.json").write_bytes(data)
        (folder / "runs" / "r.md").write_text("# the run's page\n")
        outcome(["benchmark", "--methods", "baseline", "--resume", "r", "--answers", folder / "runs",
                 "--out", folder / "runs"], capsys)
        assert (folder / "runs" / "r.md").read_text() == "# the run's page\n"  # no model ran, nothing rewritten


@EXAMPLES
@given(data=st.one_of(st.binary(max_size=40), JSON.map(lambda v: json.dumps(v).encode()),
                      st.lists(st.lists(st.integers(-2, 3), max_size=3), max_size=4).map(
                          lambda v: json.dumps({"paths": v}).encode())))
def test_tree_files(data, capsys):
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "t.json").write_bytes(data)
        outcome(["generate", "--prompt", "hi", "--ea-model", "random", "--tree", Path(folder) / "t.json"], capsys)


NUMBER_TEXT = st.one_of(st.integers(-2**80, 2**80).map(str), st.floats(allow_nan=True).map(repr),
                        st.sampled_from(["1e23", "-0", "inf", "-inf", "nan", "", " ", "0x10", "1_000", "١"]))


@EXAMPLES
@given(option=st.sampled_from(["--seed", "--temperature", "--max-new-tokens", "--total-tokens", "--depth",
                               "--top-k", "--nodes", "--threshold", "--max-depth", "--draft-vocab", "--device"]),
       value=NUMBER_TEXT, tree=st.sampled_from(["eagle_default", "eagle2", "opt_tree"]))
def test_generate_options(option, value, tree, capsys):
    outcome(["generate", "--prompt", "hi", "--ea-model", "random", "--tree", tree, option, value], capsys)


@EXAMPLES
@given(option=st.sampled_from(["--question-begin", "--question-end", "--turns", "--seed", "--temperature",
                               "--max-new-tokens"]), value=NUMBER_TEXT)
def test_bench_options(option, value, capsys):
    with tempfile.TemporaryDirectory() as folder:
        outcome(["bench", "--method", "baseline", "--answer-file", Path(folder) / "a.jsonl", option, value], capsys)


@EXAMPLES
@given(p=st.one_of(JSON, st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=4)),
       q=st.lists(st.floats(0, 1), min_size=1, max_size=4), n=st.integers(-3, 6))
def test_acceptance_distributions(p, q, n, capsys):
    total = math.fsum(q)
    q = [v / total for v in q] if total > 0 else [1.0]
    try:
        text = json.dumps(p)
    except ValueError:
        text = repr(p)
    outcome(["acceptance", "--p", text, "--q", json.dumps(q), "--n", str(n)], capsys)


@EXAMPLES
@given(step=st.sampled_from(["read", "tables", "chart", "rename"]), data=cut(line_bytes([ANSWER, ANSWER | {
    "question_id": 91}])))
def test_an_interrupted_report_leaves_the_earlier_page_whole(step, data, monkeypatch, capsys):
    """Ctrl-C at any step of `report` (and an answer file a kill cut short): one line, exit 130, and the page
    that was there before is whole, with no temporary file beside it."""
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    target = {"read": (report.bench, "read_rows"), "tables": (report, "markdown"), "chart": (outputs, "save_figure"),
              "rename": (os, "replace")}[step]
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "a.jsonl").write_bytes(data)
        (folder / "r.md").write_text("# the earlier page\n")
        with monkeypatch.context() as patch:
            patch.setattr(*target, interrupt)
            capsys.readouterr()
            code = cli.main(["report", str(folder / "a.jsonl"), "--out", str(folder / "r")])
        err = capsys.readouterr().err
        if code == 2:  # nothing finished in the file: refused before the interruption
            assert err.count("\n") == 1
        else:
            assert code == 130 and err.count("\n") == 1 and err.startswith("eagle-mdsd: interrupted:"), err
        assert (folder / "r.md").read_text() == "# the earlier page\n"
        assert sorted(p.name for p in folder.iterdir()) == ["a.jsonl", "r.md"]


@EXAMPLES
@given(prompt=st.one_of(st.binary(min_size=0, max_size=12).map(os.fsdecode), st.text(max_size=8)))
def test_prompt_bytes(prompt, capsys):
    """Any bytes as --prompt (the command line keeps those that are not UTF-8 as lone surrogates): bytes that are
    not UTF-8, and a blank prompt, are refused before the model loads."""
    result = outcome(["generate", "--prompt", prompt, "--ea-model", "random"], capsys)
    assert result == ("error" if validate.not_utf8(prompt) or not prompt.strip() else "accepted")


def _odd_path(folder: Path, kind: str, name: str) -> Path:
    """A path of `kind` under `folder`: a pipe, a folder, a device, a path under a file, a name of any bytes."""
    if kind == "pipe":
        os.mkfifo(folder / "pipe.jsonl")
        return folder / "pipe.jsonl"
    if kind == "folder":
        (folder / "dir.jsonl").mkdir()
        return folder / "dir.jsonl"
    if kind == "device":
        return Path(name and "/dev/full" or "/dev/null")
    if kind == "under-file":
        return folder / "earlier.md" / "a.jsonl"
    return folder / (name.replace("/", "_").replace("\0", "_") or "_")  # a name of any bytes or text


ODD_PATHS = st.tuples(st.sampled_from(["pipe", "folder", "device", "under-file", "name"]),
                      st.one_of(st.binary(max_size=10).map(os.fsdecode), st.text(max_size=10)))


@EXAMPLES
@given(path=ODD_PATHS, command=st.sampled_from(["bench", "report", "report-answers"]))
def test_odd_paths(path, command, capsys):
    """Odd paths to write (an answer file, a page) or read (answers): refused, accepted, or done; never a
    traceback or a hang, and earlier files untouched."""
    with tempfile.TemporaryDirectory() as folder:
        folder, earlier = Path(folder), Earlier(Path(folder))
        odd = _odd_path(folder, *path)
        if command == "bench":
            outcome(["bench", "--method", "baseline", "--question-end", "1", "--answer-file", odd], capsys)
        elif command == "report":
            if path[0] == "device":
                return  # (a page beside a device would be written into /dev)
            outcome(["report", earlier.answers, "--out", odd], capsys)
        else:
            outcome(["report", odd, "--out", folder / "r"], capsys)
        assert earlier.untouched()
