"""What scripts/gpu_train_head.sh does in Python: a data stage's answers packed as token ids (ids.npz) to bring back
from the device and put back as shards on a fresh machine, and the call's summary.json.

    python scripts/gpu_train_head.py restore RUN PREVIOUS SHARD_SIZE
    python scripts/gpu_train_head.py summary OUT STAGES RUN...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy
import torch


def _shards(run: Path) -> list[Path]:
    return sorted((run / "data").glob("shard_*.pt"))


def load_samples(run: Path) -> list[list[dict]]:
    """The samples of each of the run's data shards."""
    return [torch.load(shard, weights_only=True) for shard in _shards(run)]


def pack_ids(run: Path, shards: list[list[dict]]) -> Path | None:
    """RUN/ids.npz from the run's data shards (`load_samples`): every sample's token ids end to end (uint16 when
    the vocabulary fits), their lengths, where each answer starts, and how many samples each shard holds; None
    without samples."""
    samples = [sample for shard in shards for sample in shard]
    if not samples:
        return None
    ids = torch.cat([s["ids"] for s in samples]).numpy()
    ids = ids.astype(numpy.uint16) if ids.max() < 2**16 else ids
    path = run / "ids.npz"
    numpy.savez(path, ids=ids, lengths=numpy.array([len(s["ids"]) for s in samples], numpy.int32),
                starts=numpy.array([s["start"] for s in samples], numpy.int32),
                shard_sizes=numpy.array([len(shard) for shard in shards]))
    return path


def restore(run: Path, previous: Path, shard_size: int) -> tuple[int, int]:
    """(samples, shards): `previous`/ids.npz put back as RUN's data shards, recorded as the token-ids-only,
    length-sorted data stage the script runs, so that stage goes on with the prompts they did not answer."""
    saved = numpy.load(previous / "ids.npz")
    if "shard_sizes" not in saved:
        raise SystemExit(f"{previous / 'ids.npz'} has no shard_sizes: it cannot be put back as a data stage's "
                         f"shards; make the data again")
    ids = torch.from_numpy(saved["ids"].astype(numpy.int32))
    samples = [{"ids": s, "start": int(start)} for s, start in zip(ids.split(saved["lengths"].tolist()),
                                                                    saved["starts"])]
    sizes = saved["shard_sizes"].tolist()
    (run / "data").mkdir(parents=True, exist_ok=True)
    first = 0
    for index, size in enumerate(sizes):
        torch.save(samples[first : first + size], run / "data" / f"shard_{index:05d}.pt")
        first += size
    (run / "data" / "prompts.json").write_text(json.dumps({"seed": 0, "shard_size": shard_size, "temperature": 0.0,
                                                          "sort_by_length": True, "features": False}))
    return len(samples), len(sizes)


def summary(runs: list[Path], loaded: dict | None = None) -> dict:
    """The call's counts: shards; with a data call's `loaded` samples (run: `load_samples`) the self-written
    prompts, answers and tokens (a train call's are the data call's, and loading every sample again would cost
    its minutes); each head's steps, epochs, seconds and log."""
    from eagle_mdsd import jsonl

    found = {"shards": sum(len(_shards(run)) for run in runs)}
    if loaded is not None:
        samples = [sample for shards in loaded.values() for shard in shards for sample in shard]
        found |= {"self_prompts": sum(len(jsonl.records(run / "self_prompts.jsonl")) for run in runs
                                      if (run / "self_prompts.jsonl").exists()),
                  "answers": len(samples), "answer_tokens": sum(len(s["ids"]) - s["start"] for s in samples),
                  "tokens": sum(len(s["ids"]) for s in samples)}
    for name in ("eagle1", "eagle3"):
        if (runs[0] / name / "checkpoint.pt").exists():
            state = torch.load(runs[0] / name / "checkpoint.pt", weights_only=False)["state"]
            found[name] = {"steps": state["step"], "epochs_done": state["epoch"],
                           "train_s": state.get("wall_time_s"), "log": state["log"]}
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    put_back = commands.add_parser("restore", help="put PREVIOUS/ids.npz back as RUN's data shards")
    put_back.add_argument("run", type=Path)
    put_back.add_argument("previous", type=Path)
    put_back.add_argument("shard_size", type=int)
    summed = commands.add_parser("summary", help="write OUT/summary.json, and each run's ids.npz after a data call")
    summed.add_argument("out", type=Path)
    summed.add_argument("stages")
    summed.add_argument("runs", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.command == "restore":
        samples, shards = restore(args.run, args.previous, args.shard_size)
        print(f"put back {samples} answers in {shards} shards")
        return 0
    loaded = {run: load_samples(run) for run in args.runs} if "data" in args.stages.split() else None
    found = summary(args.runs, loaded)
    (args.out / "summary.json").write_text(json.dumps(found))
    for run, shards in (loaded or {}).items():
        pack_ids(run, shards)
    print(json.dumps({k: v for k, v in found.items() if k not in ("eagle1", "eagle3")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
