"""The command line's error path: bad input is one line with exit status 2, a bug keeps its traceback."""

import argparse
import json
from pathlib import Path

import pytest

from eagle_mdsd import cli, errors, training
from eagle_mdsd import report as report_module


def _parsers(parser: argparse.ArgumentParser, name: str = "eagle-mdsd"):
    """(command, parser) of the command and of every subcommand, nested ones included."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def _answers(tmp_path) -> Path:
    answers = tmp_path / "answers.jsonl"
    answers.write_text('{"question_id": 1, "model_id": "m", "category": "x", "choices": [{"turns": ["a"], '
                       '"new_tokens": [3], "wall_time": [1.0], "idxs": [3]}]}\n')
    return answers


@pytest.mark.parametrize("bug", [KeyError("turns"), ValueError("a bug, not bad input"), RuntimeError("a bug")])
def test_a_bug_inside_a_subcommand_is_not_swallowed(bug, monkeypatch, tmp_path, capsys):
    def broken(*args, **kwargs):
        raise bug

    monkeypatch.setattr(report_module, "write", broken)
    with pytest.raises(type(bug)) as raised:  # main lets it through, so its traceback is shown
        cli.main(["report", str(_answers(tmp_path)), "--out", str(tmp_path / "rep")])
    assert raised.value is bug and "eagle-mdsd: error:" not in capsys.readouterr().err


def test_a_bug_inside_a_training_stage_is_not_swallowed(monkeypatch, tmp_path):
    monkeypatch.setattr(training, "train", lambda *args, **kwargs: {}["log"])
    with pytest.raises(KeyError):
        cli.main(["train-head", "train", "--run", str(tmp_path)])


def test_bad_input_is_one_line_with_exit_status_2(monkeypatch, tmp_path, capsys):
    def refused(*args):
        raise errors.UsageError("bad input")

    monkeypatch.setattr(report_module, "write", refused)
    assert cli.main(["report", str(_answers(tmp_path))]) == 2
    assert capsys.readouterr().err == "eagle-mdsd: error: bad input\n"
    monkeypatch.undo()
    assert cli.main(["report", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "rep")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("eagle-mdsd: error: answer file") and error.count("\n") == 1, error


def test_an_option_a_subcommand_does_not_read_is_argparses_usage_error(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["train-head", "export", "--epochs", "2"])
    error = capsys.readouterr().err
    assert stop.value.code == 2 and error.count("\n") == 1  # one line, as every usage error (validate.Parser)
    assert error.startswith("eagle-mdsd: error: unrecognized arguments: --epochs 2")


def test_every_dtype_defaults_to_bfloat16():
    dtypes = {command: parser.get_default("dtype") for command, parser in _parsers(cli.build_parser())
              if any(action.dest == "dtype" for action in parser._actions)}
    assert {"eagle-mdsd generate", "eagle-mdsd bench", "eagle-mdsd train-head data"} <= set(dtypes)
    assert set(dtypes.values()) == {"bfloat16"}


def test_help_strings_are_short_and_options_are_declared_once():
    for command, parser in _parsers(cli.build_parser()):
        flags = [flag for action in parser._actions for flag in action.option_strings]
        assert len(flags) == len(set(flags)), command
        for action in parser._actions:
            assert len(action.help or "") <= 160, (command, action.option_strings, action.help)


def test_no_module_of_the_command_line_is_over_250_lines():
    for module in Path(cli.__file__).parent.glob("*.py"):
        assert len(module.read_text().splitlines()) <= 250, module.name


def test_a_missing_file_is_a_usage_error_and_a_file_not_found_error(tmp_path):
    with pytest.raises(errors.MissingFile) as raised:
        errors.read_text(tmp_path / "none.txt", "openers file")
    assert isinstance(raised.value, errors.UsageError) and isinstance(raised.value, FileNotFoundError)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(errors.UsageError, match="settings file .*bad.json is not valid JSON"):
        errors.read_json(tmp_path / "bad.json", "settings file")
    with pytest.raises(errors.UsageError, match="is a folder"):
        errors.read_text(tmp_path, "question file")


@pytest.mark.parametrize("argv", [["report", "a.jsonl", "--out", "{file}/report"],
                                  ["bench", "--answer-file", "{file}/a.jsonl"], ["benchmark", "--answers", "{file}"],
                                  ["study", "all", "--run", "{file}"], ["train-head", "data", "--run", "{file}/run"]])
def test_an_output_path_that_cannot_be_made_is_refused_by_the_parser(argv, tmp_path, capsys):
    in_the_way = tmp_path / "file"
    in_the_way.write_text("")
    with pytest.raises(SystemExit) as stop:
        cli.main([word.format(file=in_the_way) for word in argv])
    error = capsys.readouterr().err
    assert stop.value.code == 2 and f"{in_the_way} is a file" in error and "Traceback" not in error


def test_acceptance_refuses_booleans_and_labels_monte_carlo_estimates(capsys):
    """JSON's true is not a probability (bool is an int to Python); a sampled estimate shows its interval."""
    assert cli.main(["acceptance", "--p", "[true, false]", "--q", "[0.5, 0.5]"]) == 2
    assert "--p must be a JSON list of probabilities" in capsys.readouterr().err
    p, q = ([value / sum(values) for value in values] for values in ([1 + i % 3 for i in range(40)],
                                                                      [1 + i % 5 for i in range(40)]))
    # 40^3 tuples: past the exact enumeration's 50,000
    assert cli.main(["acceptance", "--p", json.dumps(p), "--q", json.dumps(q), "--n", "3"]) in (0, None)
    rows = capsys.readouterr().out.splitlines()
    assert any("rrs_w " in row and "(Monte Carlo)" in row for row in rows)
    assert not any("kseq" in row and "Monte Carlo" in row for row in rows)  # K-SEQ has a closed form


@pytest.mark.parametrize("argv, said", [
    (["generate", "--prompt", "hi", "--tree", "chain99999999"], "tree chain99999999: at most 1024 nodes"),
    (["generate", "--prompt", "hi", "--tree", "opt_tree:threshold=nan"], "--threshold must be a number >= 0, got nan"),
    (["generate", "--prompt", "hi", "--temperature", "1e-30"], "--temperature 1e-30 is too small to sample at"),
    (["acceptance", "--p", "[0.5, 0.5]", "--q", "[0.5, 0.5]", "--n", "1000000"], "--n 1000000: at most 16 drafts"),
    (["bench-core", "--max-drafts", "40"], "--max-drafts 40: at most 16 drafts"),
    (["sequoia", "--max-nodes", "1500"], "--max-nodes 1500: a tree holds at most 1024 nodes"),
    (["benchmark", "--resume", ""], "or --resume is empty"),
])
def test_inputs_that_used_to_hang_or_fill_the_memory_are_one_line(argv, said, monkeypatch, capsys):
    """Each refused before any model loads (a huge chain's paths, a million drafts, a NaN threshold that quietly
    crippled the tree, a temperature whose logits / T overflow)."""
    from eagle_mdsd import models

    monkeypatch.setattr(models, "load_target", lambda *args, **kwargs: pytest.fail("the model loaded"))
    assert cli.main(argv) == 2
    error = capsys.readouterr().err
    assert said in error and error.count("\n") == 1, error
