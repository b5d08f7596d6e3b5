"""scripts/compare_revisions.py: the per-question ratio and its interval, and a cell's rows."""

import math

import pytest

import evaluation_scripts


@pytest.fixture(scope="module")
def script():
    return evaluation_scripts.load("compare_revisions")


def test_the_per_question_ratio_is_a_geometric_mean_with_a_t_interval(script):
    assert script.paired_ratio([2.2, 4.4, 1.1], [2.0, 4.0, 1.0]) == pytest.approx((1.1, 1.1, 1.1))
    # log ratios log 2 and log 0.5: mean 0, standard deviation sqrt(2) log 2, two samples (t = 12.706)
    ratio, low, high = script.paired_ratio([2.0, 1.0], [1.0, 2.0])
    half = 12.7062047 * math.sqrt(2) * math.log(2) / math.sqrt(2)
    assert (ratio, low, high) == pytest.approx((1.0, math.exp(-half), math.exp(half)))
    assert script.paired_ratio([3.0], [2.0]) == pytest.approx((1.5, 1.5, 1.5))  # one question: no interval


def test_a_cells_rows_split_tokens_per_second_into_tau_and_ms_a_cycle(script):
    """Two fake engines: the working tree's cycles cost 10% less and accept as much; its row says both."""
    from types import SimpleNamespace

    class Engine:
        def __init__(self, cycle_s):
            self.cycle_s = cycle_s

        def generate(self, prompt, tokens, temperature, seed=0, method="eagle"):
            cycles = tokens // 2
            return SimpleNamespace(new_tokens=tokens, cycles=cycles, prefill_time_s=0.5,
                                   wall_time_s=0.5 + cycles * self.cycle_s)

    args = SimpleNamespace(method="eagle", max_new_tokens=64)
    rows = script.timed_rows({"revision": Engine(0.05), "working tree": Engine(0.045)}, [[1], [2]], "chain2", 0.0,
                             args)
    old, new = ([cell.strip() for cell in row.strip("|").split("|")] for row in rows)
    assert old[4:6] == new[4:5] + ["50.0"] and new[5] == "45.0"  # tau 2.00 in both; ms a cycle
    assert float(new[7].removesuffix("x")) == pytest.approx((0.5 + 1.6) / (0.5 + 1.44), abs=0.01)  # with prefills


def test_a_revision_with_a_slash_or_a_tilde_imports_as_a_package_of_its_own(script, tmp_path):
    """heads/main or HEAD~0 named the package folder as given: the rename failed (a '/') or the import did."""
    import subprocess

    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=script.ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    engine = script.engine_at("HEAD~0", tmp_path)
    assert engine.__name__ == "eagle_mdsd_at_HEAD_0.engine" and hasattr(engine, "Decoder")


def test_the_page_is_written_whole_after_every_cell_and_says_which_cells_a_cut_run_left(script, tmp_path,
                                                                                       monkeypatch):
    """The page was written only at the end: Ctrl-C an hour in lost every finished cell.  The models and engines are
    stand-ins; a cell's rows name its tree and temperature."""
    import subprocess
    import sys

    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=script.ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    monkeypatch.setattr(script, "RESULTS", tmp_path)
    monkeypatch.setattr(script.models, "load_target", lambda *args: (None, None))
    monkeypatch.setattr(script.head, "load_head", lambda *args: None)
    monkeypatch.setattr(script.models, "eos_token_ids", lambda *args: ())
    monkeypatch.setattr(script.bench, "conversation_ids", lambda *args: [1])
    monkeypatch.setattr(script, "engine_at", lambda *args: None)
    monkeypatch.setattr(script, "decoders_for", lambda *args: {})
    cells = []

    def timed_rows(decoders, prompts, label, temperature, args):
        if len(cells) == stop_at:
            raise KeyboardInterrupt
        cells.append((label, temperature))
        return [f"| {label} | {temperature:g} | revision |", f"| {label} | {temperature:g} | working tree |"]

    monkeypatch.setattr(script, "timed_rows", timed_rows)
    monkeypatch.setattr(sys, "argv", ["compare_revisions.py", "HEAD", "--questions", "2", "--trees", "chain2",
                                      "chain3", "--temperatures", "0", "1", "--name", "page"])
    stop_at = 3
    with pytest.raises(KeyboardInterrupt):
        script.main()
    page = (tmp_path / "page.md").read_text()
    assert [line for line in page.splitlines() if line.startswith("| chain")] == [
        "| chain2, topk/topk | 0 | revision |", "| chain2, topk/topk | 0 | working tree |",
        "| chain2, topk/topk | 1 | revision |", "| chain2, topk/topk | 1 | working tree |",
        "| chain3, topk/topk | 0 | revision |", "| chain3, topk/topk | 0 | working tree |"]
    assert ("Partial: 3 of the run's 4 cells measured (it was cut short, or is still running); not measured: "
            "chain3 at T = 1.") in page
    assert [path.name for path in tmp_path.iterdir()] == ["page.md"]  # no temporary file left beside it

    cells.clear()
    stop_at = None
    script.main()
    whole = (tmp_path / "page.md").read_text()
    assert "Partial" not in whole and whole.count("| chain3, topk/topk | 1 |") == 2
    assert [path.name for path in tmp_path.iterdir()] == ["page.md"]


@pytest.mark.parametrize("name, message", [("a/b", "must be a plain file name"), ("", "must be a plain file name")])
def test_the_page_name_is_a_plain_file_name(script, monkeypatch, capsys, name, message):
    monkeypatch.setattr(script.models, "load_target", lambda *args: pytest.fail("the model loaded"))
    monkeypatch.setattr("sys.argv", ["compare_revisions.py", "HEAD", "--name", name])
    with pytest.raises(SystemExit) as stop:
        script.main()
    assert stop.value.code == 2 and message in capsys.readouterr().err
