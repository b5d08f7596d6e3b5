"""evaluation/host_overhead.py: its page is written whole after every row, so a run cut short keeps its rows."""

import sys

import pytest

import evaluation_scripts
from tiny import tiny_target


@pytest.fixture(scope="module")
def script():
    return evaluation_scripts.load("host_overhead")


class Runner:
    """A row's stand-in: fixed counts and milliseconds; `interrupt` stops the run at its counts, as Ctrl-C would."""

    def __init__(self, counts: dict, interrupt: bool = False):
        self.fixed, self.interrupt = counts, interrupt

    def counts(self) -> dict:
        if self.interrupt:
            raise KeyboardInterrupt
        return self.fixed

    def ms(self, repeats: int) -> float:
        return 2.0


def test_the_page_is_written_whole_after_every_row_and_names_the_rows_a_cut_run_left(script, tmp_path,
                                                                                    monkeypatch):
    """The page was written only at the end: Ctrl-C during a row lost every finished one."""
    eager = {"transfers": 1.0, "uploads": 0.0, "ops": 100.0}
    labels = ["transformers `generate` step", *(row[0] for row in script.ROWS)]
    stop_at = labels.index("chain2")
    monkeypatch.setattr(script, "tiny_smollm_shape", lambda: tiny_target(vocab=16).float())
    monkeypatch.setattr(script, "transformers_generate", lambda target, tokens: Runner(eager))
    monkeypatch.setattr(script, "ours", lambda target, draft_head, row, tokens, kernels, cuda_graphs="off": Runner(
        {"ops": 3.0, "replays": 2.0, "transfers": 1.0} if cuda_graphs == "emulate" else eager,
        interrupt=cuda_graphs == "off" and row[0] == labels[stop_at] and stop))
    monkeypatch.setattr(sys, "argv", ["host_overhead.py", "--out", str(tmp_path), "--repeats", "1"])
    stop = True
    with pytest.raises(KeyboardInterrupt):
        script.main()
    page = (tmp_path / "host_overhead.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| ") and not line.startswith("| per cycle")]
    assert rows == ["| transformers `generate` step | 1.00 | 0.00 | 100 | 1.00x | 2.00 | 1.00x | - | - | - |",
                    "| our plain step | 1.00 | 0.00 | 100 | 1.00x | 2.00 | 1.00x | 3 | 2.0 | 1.00 |",
                    "| eagle_default | 1.00 | 0.00 | 100 | 1.00x | 2.00 | 1.00x | 3 | 2.0 | 1.00 |"]
    left = "; ".join(labels[stop_at:])
    assert (f"Partial: {stop_at} of the run's {len(labels)} rows measured (it was cut short, or is still running); "
            f"not measured: {left}.") in page
    assert [path.name for path in tmp_path.iterdir()] == ["host_overhead.md"]  # no temporary file left beside it

    stop = False
    script.main()
    whole = (tmp_path / "host_overhead.md").read_text()
    assert "Partial" not in whole and [line.split(" | ")[0][2:] for line in whole.splitlines()
                                       if line.startswith("| ") and not line.startswith("| per cycle")] == labels
    assert [path.name for path in tmp_path.iterdir()] == ["host_overhead.md"]
