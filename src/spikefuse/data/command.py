"""`spikefuse data list` and `spikefuse data cache NAME [--root ROOT]`."""
from __future__ import annotations

import argparse
import sys

from ..errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub.add_parser("list", help="list the data sets")
    cache = sub.add_parser("cache", help="download (through Tonic) and pack a data set into the disk cache")
    cache.add_argument("name", help="data set name (see `spikefuse data list`)")
    cache.add_argument("--root", default="~/.cache/spikefuse", help="data and cache folder (default %(default)s)")
    cache.add_argument("--time-steps", type=int, default=None, help="frames per sample (default: the set's own)")
    cache.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from . import DATASETS, DatasetUnavailable, load

    if args.action == "list":
        width = max(map(len, DATASETS))
        for name, text in DATASETS.items():
            print(f"{name:<{width}}  {text}")
        return 0
    if args.name not in DATASETS:
        print(f"spikefuse data: error: unknown data set {args.name!r}; valid names: {', '.join(DATASETS)}",
              file=sys.stderr)
        return 2
    try:
        splits = load(args.name, time_steps=args.time_steps, root=args.root, seed=args.seed)
    except DatasetUnavailable as e:
        print(f"spikefuse data: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # bad parameters (time steps, seed), more memory than there is
        raise UsageError(str(e)) from None
    print(f"{splits.name}: {len(splits.train)} train / {len(splits.test)} test samples, "
          f"{splits.num_classes} classes, input {splits.input_shape} x {splits.time_steps} steps")
    return 0
