"""evaluation/gpu_cycle.py, the GPU step's cycle timing, runs on a CPU at toy scale (DEVICE=cpu)."""

from __future__ import annotations

import json
import re

import pytest
import torch

import evaluation_scripts


def test_the_cycle_timing_writes_its_page_on_a_cpu(tmp_path):
    """Every row at toy scale (hf_compiled left out: its compile is tested in test_compiled_peer.py), the floor, and
    tokens/s projected from a benchmark result's tau, labelled as a projection."""
    result = tmp_path / "result.json"
    entry = {"label": "eagle[chain2]", "categories": {"all": {"tau": 2.0}}}
    result.write_text(json.dumps({"temperatures": {"t0": {"entries": [entry]}, "t1": {"entries": []}}}))
    evaluation_scripts.load("gpu_cycle").main(["--shape", "tiny", "--device", "cpu", "--tokens", "6", "--repeats", "1",
                                               "--prompt", "16", "--out", str(tmp_path), "--no-compiled",
                                               "--tau-from", str(result)])
    page = (tmp_path / "gpu_cycle_tiny.md").read_text()
    for row in ("| ours, plain step |", "| transformers `generate` (eager), step |",
                *(f"| ours, {tree} cycle, T = {t} |" for tree in ("eagle_default", "chain2", "eagle2") for t in (0, 1))):
        assert row in page
    assert "Weight-read floor: " in page and "no GPU (device cpu)" in page
    rows = {line.split(" | ")[0][2:]: line for line in page.splitlines() if line.startswith("| ours, ")}
    assert re.search(r"\| -?\d+ \(tau 2\.00\) \|$", rows["ours, chain2 cycle, T = 0"])  # the result's tau, T = 0
    assert rows["ours, chain2 cycle, T = 1"].endswith("| - |")  # no tau of chain2 at T = 1 in that result
    assert "Projected tokens/s (a projection, not a measurement)" in page
    assert all(line.split(" | ")[5] == "off" for line in rows.values())  # no CUDA graphs on a CPU, said per row
    assert "CUDA graphs: off on this device; every row of ours ran eagerly." in page


def test_our_compiled_rows_are_timed_beside_the_others(tmp_path, monkeypatch):
    """--compile-ours: our plain step and eagle_default at each temperature with --cuda-graphs compile, the
    projected tokens/s of their uncompiled rows' tau.  torch.compile is the identity here: the page's rows are
    under test (test_device_cycle.py traces the compiled forwards, and -m slow runs inductor)."""
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda module, **options: compiled.append(type(module).__name__) or module)
    result = tmp_path / "result.json"
    entry = {"label": "baseline", "categories": {"all": {"tau": 1.0}}}
    result.write_text(json.dumps({"temperatures": {"t0": {"entries": [entry]}}}))
    evaluation_scripts.load("gpu_cycle").main(["--shape", "tiny", "--device", "cpu", "--tokens", "4", "--repeats", "1",
                                               "--prompt", "8", "--out", str(tmp_path), "--no-compiled",
                                               "--trees", "chain2", "--compile-ours", "--tau-from", str(result)])
    page = (tmp_path / "gpu_cycle_tiny.md").read_text()
    assert re.search(r"\| ours, compiled plain step \| [\d.]+ \|.* \| off \| -?\d+ \(tau 1\.00\) \|", page)
    for t in (0, 1):
        assert f"| ours, compiled eagle_default cycle, T = {t} |" in page
    assert {"LlamaModel", "EagleHead"} <= set(compiled)  # the target's decoder and the head went through it


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_the_cycle_timing_refuses_cuda_without_a_gpu(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        evaluation_scripts.load("gpu_cycle").main(["--device", "cuda", "--out", str(tmp_path)])
    assert stop.value.code == 2 and "error: --device cuda but torch sees no CUDA device" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("option, message", [
    (["--device", "tpu"], "--device tpu: use cpu"), (["--tokens", "0"], "--tokens: must be at least 1"),
    (["--repeats", "0"], "--repeats: must be at least 1"), (["--prompt", "-1"], "--prompt: must be at least 1"),
    (["--temperatures", "nan"], "each of --temperatures must be >= 0"), (["--trees", "nope"], "unknown tree 'nope'"),
    (["--tau-from", "WRONG"], "is no benchmark result JSON"), (["--out", "FILE"], "is a file: give a folder")])
def test_every_option_of_the_cycle_timing_is_checked_before_the_target_is_built(tmp_path, capsys, monkeypatch,
                                                                                 option, message):
    script = evaluation_scripts.load("gpu_cycle")
    monkeypatch.setattr(script, "random_target", lambda *args: pytest.fail("the target was built"))
    (tmp_path / "wrong.json").write_text('{"x": 1}')
    (tmp_path / "file").write_text("")
    option = [{"WRONG": str(tmp_path / "wrong.json"), "FILE": str(tmp_path / "file")}.get(o, o) for o in option]
    with pytest.raises(SystemExit) as stop:
        script.main(["--shape", "tiny", "--device", "cpu", *option])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err and err.count("\n") <= 2 and "Traceback" not in err, err


def test_the_busy_share_sums_the_device_events_alone():
    """busy_share's sum and count over the profiler's raw events: device events count, host ones do not."""

    class Event:
        def __init__(self, device, nanoseconds):
            self.device, self.nanoseconds = device, nanoseconds

        def device_type(self):
            return self.device

        def duration_ns(self):
            return self.nanoseconds

    kinds = torch.autograd.DeviceType
    events = [Event(kinds.CUDA, 2_000_000), Event(kinds.CPU, 9_000_000), Event(kinds.CUDA, 500_000)]
    seconds, count = evaluation_scripts.load("gpu_cycle").device_activity(events)
    assert seconds == pytest.approx(0.0025) and count == 2


def test_the_busy_share_leaves_the_prefill_out(monkeypatch):
    """busy_share profiles a call of n tokens and a call of 1 and takes the difference, as the ms a cycle do: the
    prefill's device time and wall time (an eager prefill keeps the GPU idle longer than the cycles do) drop out."""
    import contextlib
    import types

    import torch.profiler

    script = evaluation_scripts.load("gpu_cycle")
    clock = {"now": 0.0}
    made = {None: (0.010 + 4 * 0.005, 0.002 + 4 * 0.004, 10 + 4 * 20, 4), 1: (0.010, 0.002, 10, 0)}  # wall, busy
    last = {}

    def call(tokens):  # a prefill of 10 ms (2 ms busy, 10 events), then 5 ms cycles (4 ms busy, 20 events) each
        last["made"] = made[tokens]
        clock["now"] += made[tokens][0]
        return made[tokens][3]

    @contextlib.contextmanager
    def profile(**_):
        yield types.SimpleNamespace(profiler=types.SimpleNamespace(kineto_results=types.SimpleNamespace(
            events=lambda: last["made"])))

    monkeypatch.setattr(torch.profiler, "profile", profile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(script.time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(script, "device_activity", lambda made: (made[1], made[2]))
    share, activities = script.busy_share(call)
    assert share == pytest.approx(0.8) and activities == pytest.approx(20)  # 4 of each cycle's 5 ms; 20 a cycle


def test_each_row_says_how_many_graphs_it_captured():
    """graphs_note: eager, or the graphs captured counted (a refused capture ends the script: graphs.py)."""
    from eagle_mdsd import graphs

    script = evaluation_scripts.load("gpu_cycle")

    class Decoder:
        def __init__(self, graphs):
            self.graphs = graphs

    captured = graphs.Emulated()
    captured.entries = {"draft": None, "verify": None}
    assert script.graphs_note(Decoder(None)) == "off"
    assert script.graphs_note(Decoder(captured)) == "2 captured"


def test_the_trace_is_saved_gzipped_and_names_the_cycle_phases(tmp_path):
    """save_trace on a CPU (host events only): a gzipped Chrome trace whose events include a decoding call's ops."""
    import gzip

    from eagle_mdsd import engine

    script = evaluation_scripts.load("gpu_cycle")
    target = script.random_target("tiny", "cpu", torch.float32)
    decoder = engine.Decoder(target)
    script.save_trace(lambda: decoder.generate([5, 6, 7], 3, 0.0, method="baseline"), tmp_path / "t.json.gz", "cpu")
    events = json.loads(gzip.decompress((tmp_path / "t.json.gz").read_bytes()))["traceEvents"]
    assert any(event.get("name") == "aten::index_copy_" for event in events)  # the cache's writes at its slots
    assert [path.name for path in tmp_path.iterdir()] == ["t.json.gz"]
