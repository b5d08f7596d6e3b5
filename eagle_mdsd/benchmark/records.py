"""A run's folder and its records: made once for a fresh run, its settings.json (the command that made it, how its
answers are made and the machine they are timed on), so that a rerun resumes only answers made the same way by
the same command, and the command that continues it."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from .. import bench, outputs
from ..benchmarks import machine, machine_line
from ..errors import UsageError, read_json


KINDS = ("benchmark", "sweep")  # the commands that make run folders; settings.json's "kind" names one
UNCHECKED = ("kind", "machine")  # what settings.json records beside how answers are made, each checked apart


def open_run_folder(folder: Path, pages: list[Path], new_run: bool, kind: str) -> None:
    """Before the model loads: a fresh run (`new_run`) makes `folder` in one step, records that command `kind`
    (one of KINDS) made it, and refuses `pages` that exist (a page is never overwritten, a folder never shared); a
    resumed one reads its settings.json, so that a broken record, a run of the other kind, or a folder without one
    (no run made it), is a one-line error now.  A record without a kind, written before runs named theirs, resumes
    under either."""
    name = Path(folder).name
    record = Path(folder) / "settings.json"
    if new_run:
        outputs.refuse_existing(pages, "page", "pass another --name, or another --out")
        outputs.new_run_folder(Path(folder), f"pass another --name, or --resume {name} to continue it")
        _write_settings(folder, {"kind": kind})
    elif Path(folder).exists() and not record.exists():  # a fresh run records its kind at once: this was never one
        raise UsageError(f"--resume {folder}: that folder holds no {kind} run (it has no settings.json): give the "
                         f"folder of a run this command made, or --name NAME for a fresh one")
    elif record.exists():
        made = read_settings(record).get("kind", kind)
        if made != kind:
            raise UsageError(f"{folder} is a {made} run, not a {kind} run (its settings.json says so): continue it "
                             f"with eagle-mdsd {made} --resume {folder}, or give --resume a {kind} run")


def file_safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def temperature_tag(temperature: float) -> str:
    return f"t{temperature:g}"


def check_settings(folder: Path, settings: dict) -> None:
    """Record how folder's answers are made (settings.json), or refuse to resume answers made otherwise."""
    record = Path(folder) / "settings.json"
    made = read_settings(record) if record.exists() else {}
    if set(made) - set(UNCHECKED):  # a fresh run's record holds only its kind until its settings join it
        changed = [f"{key} {made.get(key)} -> {value}" for key, value in settings.items() if made.get(key) != value]
        if changed:
            raise UsageError(f"{folder} holds answers made with other settings ({'; '.join(changed)}): pass "
                             f"another --name, or delete the folder to start over")
        return
    if any(Path(folder).glob("*.jsonl")):
        raise UsageError(f"{folder} holds answers without a settings.json record of how they were made: pass "
                         f"another --name, or delete the folder to start over")
    _write_settings(folder, made | settings)


def read_settings(record: Path) -> dict:
    """A run's settings.json; a broken one is a one-line error naming it."""
    made = read_json(record, "run settings", "restore it from the run's copy, or delete the run folder to start "
                                             "over", kind=dict)
    machine_record = made.get("machine")
    if machine_record is not None and not (isinstance(machine_record, dict)
                                           and {"cpu", "threads", "torch"} <= set(machine_record)
                                           and isinstance(machine_record["cpu"], str)):
        raise UsageError(f"run settings {record} has a 'machine' that is no record of a machine: restore it from "
                         f"the run's copy, or delete the run folder to start over")
    if made.get("kind", KINDS[0]) not in KINDS:
        raise UsageError(f"run settings {record} has a 'kind' that is no command that makes runs ({made['kind']!r}, "
                         f"not one of {', '.join(KINDS)}): restore it from the run's copy, or delete the run folder "
                         f"to start over")
    return made


def _write_settings(folder: Path, settings: dict) -> None:
    """folder/settings.json, written whole or not at all."""
    outputs.write_atomically(Path(folder) / "settings.json", json.dumps(settings, indent=1) + "\n")


def timing_machine(folder: Path, answer_files, chosen: list[dict], device: str = "cpu") -> dict:
    """The machine a folder's answers are timed on: recorded in its settings.json by the first run, and named
    by every report of them, whichever machine rewrites the report.  Adding answers on another machine would
    mix two machines' timings in one table: a one-line error (when every answer file already holds every
    chosen question, the run only reports)."""
    wanted = {q["question_id"] for q in chosen}
    finished = all(wanted <= bench.finished_ids(Path(f)) for f in answer_files)
    record = Path(folder) / "settings.json"
    settings = read_settings(record) if record.exists() else {}
    here, made = machine(device), settings.get("machine")
    if made is None:
        settings["machine"] = made = here
        _write_settings(folder, settings)
    elif (made["cpu"], made.get("gpu")) != (here["cpu"], here.get("gpu")) and not finished:
        raise UsageError(f"{folder} holds answers timed on {machine_line(made)} and this machine is "
                         f"{machine_line(here)}: finish them there, or pass another --name")
    return made


def held_questions(answer_files) -> list[int]:
    """The ids of the questions any of `answer_files` finished: what a run's tables hold."""
    return sorted(set().union(*(bench.finished_ids(f) for f in answer_files)))


def resume_command(command: str | None, name: str, kind: str) -> str:
    """The command line that continues run `name`: `command` with --name NAME turned into --resume NAME (one
    that already resumes stays as it is); without a command, the bare `eagle-mdsd KIND --resume NAME`."""
    if not command:
        return f"eagle-mdsd {kind} --resume {name} (with the options of the interrupted run)"
    words, kept, skip = shlex.split(command), [], False
    if any(word == "--resume" or word.startswith("--resume=") for word in words):
        return command
    for word in words:
        if skip:
            skip = False
        elif word == "--name":
            skip = True
        elif not word.startswith("--name="):
            kept.append(word)
    return shlex.join(kept + ["--resume", name])
