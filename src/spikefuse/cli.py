"""The `spikefuse` command line: train | bench | data | export | plan.

Each subcommand lives in its own module with two functions,
`configure(parser)` and `run(args) -> int`; this file only wires them up,
importing a module when its subcommand is used so `--help` stays fast.
Every failure is one line on stderr: exit code 2 for usage errors, 1 for faults while
running, 130 for Ctrl-C; `--debug` adds the traceback. Under torchrun every process prints
its own failure, naming its rank; warnings come from rank 0 only.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import sys
import traceback
import warnings

COMMANDS = {
    "train": ("spikefuse.train.command", "train a network (default: embedded digits, no download)"),
    "bench": ("spikefuse.bench.command", "run a benchmark (lif | train | steps | sparse | data | neurons | parallel | on | all) and write results"),
    "data": ("spikefuse.data.command", "inspect, download or cache an event data set"),
    "export": ("spikefuse.train.export", "export a trained run as a NIR graph"),
    "plan": ("spikefuse.parallel.planner", "predict the temporal pipeline on N GPUs: speedup, stage cut, chunks, memory"),
}


from spikefuse.errors import RunError, UsageError, one_line  # one class, also when run as python -m spikefuse.cli

DEBUG_HELP = "on an error, print the traceback too"
# argparse takes '-1' and '-.5' for values but '-inf', '-nan' and '-1e-3' for options ("--lr -1e-3":
# "expected one argument"); read as values, they reach the option's own check and its message
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)


class Parser(argparse.ArgumentParser):
    """argparse's parser with NEGATIVE_NUMBER as its test for a negative number (its
    subcommands' parsers are of the same class)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = Parser(prog="spikefuse", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # also after the subcommand; SUPPRESS so it does not reset a --debug given before it
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
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
    args.argv = argv  # what `train --gpus N` hands to the processes it starts
    name = f"spikefuse {args.command}{_rank_tag()}"
    try:
        with warnings.catch_warnings():
            if os.environ.get("RANK", "0") != "0":  # torchrun: rank 0 speaks for all
                warnings.simplefilter("ignore")
            elif not args.debug:  # one line each too, without the source line Python adds
                warnings.showwarning = lambda message, *_, **__: print(
                    f"{name}: warning: {message}", file=sys.stderr)
            return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)
    except (Exception, KeyboardInterrupt) as e:
        if args.debug:
            traceback.print_exc()
        code, message = explain(e)
        print(f"{name}: {message}", file=sys.stderr)
        return code


def _rank_tag() -> str:
    """" (rank r/N)" in a process torchrun started with others, else nothing."""
    world = os.environ.get("WORLD_SIZE", "1")
    return f" (rank {os.environ['RANK']}/{world})" if "RANK" in os.environ and world not in ("", "1") else ""


def explain(e: BaseException) -> tuple[int, str]:
    """(exit code, one-line message) for an error that reached the command line."""
    if isinstance(e, UsageError):
        return 2, f"error: {e}"
    if isinstance(e, RunError):
        return 1, f"error: {e}"
    if isinstance(e, KeyboardInterrupt):
        return 130, "interrupted"
    if _is_out_of_memory(e):
        return 1, (f"error: out of memory ({one_line(e)}); lower --batch-size or --time-steps "
                   "(or the model's size)")
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f" writing {e.filename}" if e.filename else ""
        return 1, f"error: no space left on the disk{where}; free some space and try again"
    return 1, f"error: {one_line(e)} (run with --debug for the traceback)"


def _is_out_of_memory(e: BaseException) -> bool:
    torch = sys.modules.get("torch")  # only a command that imported torch can run out of its memory
    return isinstance(e, MemoryError) or (torch is not None and isinstance(e, torch.cuda.OutOfMemoryError))


if __name__ == "__main__":
    sys.exit(main())
