"""The `spikefuse` command line: train | bench | data | export | plan.

Each subcommand lives in its own module with two functions,
`configure(parser)` and `run(args) -> int`; this file only wires them up,
importing a module when its subcommand is used so `--help` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "train": ("spikefuse.train.command", "train a network (default: embedded digits, no download)"),
    "bench": ("spikefuse.bench.command", "run a benchmark (lif | train | data) and write results"),
    "data": ("spikefuse.data.command", "inspect, download or cache an event data set"),
    "export": ("spikefuse.train.export", "export a trained run as a NIR graph"),
}


from spikefuse.errors import UsageError  # one class, also when run as python -m spikefuse.cli


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spikefuse", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == wanted:  # only the chosen subcommand pays for its imports
            importlib.import_module(module).configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)
    except UsageError as e:
        print(f"spikefuse {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
