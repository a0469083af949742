"""The data benchmarks alone: how a corpus is batched, planned and loaded, without the train-step cases.

    python -m scripts.benchmark_data --padding --dataset-path DIR      # random, buckets, frames: padding, items/s
    python -m scripts.benchmark_data --plan 1000000                    # an epoch planned over a million lengths
    python -m scripts.benchmark_data --plan-corpus --dataset-path DIR  # a corpus read, measured and planned
    python -m scripts.benchmark_data --loader --dataset-path DIR       # input pipeline items/s
    python -m scripts.benchmark_data --sources --dataset-path DIR --shards SHARDS s3://BUCKET/PREFIX  # with shards

It is ``python -m scripts.benchmark`` with one of these modes and takes the same options (``--help``); that module's
docstring says what each row holds. Exit status as there; 2 where no data mode is given.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

if not __package__:  # run by its path, not as python -m scripts.NAME: the project's modules would not import
    sys.exit(f"ERROR: run this tool from the project folder as: python -m scripts.{Path(__file__).stem} ...")

from parts import PARTS
from scripts import benchmark

DATA_MODES = ("--loader", "--padding", "--plan", "--plan-corpus", *(("--sources",) if PARTS.run.corpus else ()))
"""The options of ``scripts.benchmark`` that choose a data benchmark (``--sources`` where the project reads shards)."""


def main(argv: Optional[list[str]] = None) -> int:
    """Run the data benchmark ``argv`` names (one of :data:`DATA_MODES`); a usage error (exit 2) without one."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not {arg.split("=")[0] for arg in argv} & {*DATA_MODES, "-h", "--help"}:
        benchmark.build_parser().error(f"give one of {', '.join(DATA_MODES)} (the train step's cases: python -m "
                                       "scripts.benchmark)")
    return benchmark.main(argv)


if __name__ == "__main__":
    sys.exit(main())
