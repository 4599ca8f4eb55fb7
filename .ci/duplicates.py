#!/usr/bin/env python3
"""CI check: duplicated code in src/spikefuse must not grow.

Runs pylint's duplicate-code checker (R0801) alone, with the settings below, over the package,
counts the duplicate pairs it reports (each R0801 message names one pair of files) and compares
the count with .ci/duplicates-baseline.json:

    {"pylint": version the counts were taken with, "min_similarity_lines": 6,
     "baseline_commit": the commit the issue measured, "baseline_count": its count,
     "allowed": the most pairs CI accepts (the count when this check was last tightened)}

It prints one line per pair (file:first-last line, 1-based, of both sides), then how many pairs
join two neuron ops (NEURON_OPS below; the goal is none), and exits 0; it exits 1 with a
one-line message when the count rises above "allowed", 2 when pylint fails to run. When the
installed pylint is not the baseline's version it says so (another version may count
differently); pyproject's test extra pins the baseline's version.

    python .ci/duplicates.py                             # the check, on this tree
    python .ci/duplicates.py --src OTHER/src/spikefuse   # the pairs of another checkout

When a duplicate is factored out, lower "allowed" in the baseline file with it.
Runs pylint in a child process, on one core: about 15 s.
"""
import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / ".ci" / "duplicates-baseline.json"
MIN_SIMILARITY_LINES = 6
PYLINT_ARGS = [
    "--rcfile=" + os.devnull,  # no pylintrc of the machine's or the tree's
    "--persistent=n", "--jobs=1", "--score=n", "--output-format=json",
    "--disable=all", "--enable=duplicate-code",
    f"--min-similarity-lines={MIN_SIMILARITY_LINES}",
    "--ignore-comments=y", "--ignore-docstrings=y", "--ignore-imports=y", "--ignore-signatures=y",
]
# the neuron ops: the acceptance line "none between neuron ops" counts pairs of two of these
NEURON_OPS = {f"src/spikefuse/ops/{m}.py" for m in (
    "lif", "alif", "cuba", "bn_lif", "recurrent_lif", "recurrent_alif", "sparse_recurrent_lif")}
# a side of a pair in the message: ==module:[start:end], start 0-based, end exclusive
_SIDE = re.compile(r"^==([\w.]+):\[(\d+):(\d+)\]$", re.M)


def find_pairs(src):
    """The duplicate pairs pylint reports in the package at `src` (a path to .../spikefuse):
    a sorted list of ((file, first, last), (file, first, last)); files as src/spikefuse/...,
    lines 1-based and inclusive."""
    src = Path(src).resolve()
    if not (src / "__init__.py").is_file():
        raise RuntimeError(f"{src} is not a package")
    proc = subprocess.run([sys.executable, "-m", "pylint", *PYLINT_ARGS, src.name],
                          cwd=src.parent, capture_output=True, text=True, check=False)
    # pylint's exit status is a bit mask: 1 fatal, 32 usage error; 8 (refactor) is the finding
    if proc.returncode & (1 | 32) or not proc.stdout.strip():
        raise RuntimeError(f"pylint failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
    pairs = []
    for msg in json.loads(proc.stdout):
        if msg["message-id"] != "R0801":
            continue
        sides = [(_file(src, m), int(a) + 1, int(b)) for m, a, b in _SIDE.findall(msg["message"])]
        if len(sides) != 2:
            raise RuntimeError(f"an R0801 message without two files: {msg['message'][:200]}")
        pairs.append(tuple(sorted(sides)))
    return sorted(pairs)


def _file(src, module):
    """src/spikefuse/ops/lif.py for spikefuse.ops.lif (a package: its __init__.py)."""
    path = src.parent / module.replace(".", "/")
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return f"{src.parent.name}/{path.relative_to(src.parent).as_posix()}"


def is_neuron_pair(pair):
    """Whether both files of the pair are neuron ops."""
    return all(file in NEURON_OPS for file, _, _ in pair)


def _where(side):
    file, first, last = side
    return f"{file}:{first}-{last}"


def main():
    """The check; its exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--src", default=ROOT / "src" / "spikefuse", help="the package to check")
    args = parser.parse_args()
    import pylint  # pylint: disable=import-outside-toplevel
    baseline = json.loads(BASELINE.read_text())
    if baseline["min_similarity_lines"] != MIN_SIMILARITY_LINES:
        print(f"duplicates: the baseline counted with --min-similarity-lines="
              f"{baseline['min_similarity_lines']}, this script uses {MIN_SIMILARITY_LINES}",
              file=sys.stderr)
        return 2
    if pylint.__version__ != baseline["pylint"]:
        print(f"duplicates: note: pylint {pylint.__version__} here, the baseline counted with "
              f"{baseline['pylint']}")
    try:
        pairs = find_pairs(args.src)
    except RuntimeError as err:
        print(f"duplicates: {err}", file=sys.stderr)
        return 2
    # largest first (longer side's line count), one line a pair
    for pair in sorted(pairs, key=lambda p: -max(last - first + 1 for _, first, last in p)):
        print(f"  {_where(pair[0])}  ==  {_where(pair[1])}")
    neuron = sum(map(is_neuron_pair, pairs))
    allowed = baseline["allowed"]
    print(f"duplicates: {len(pairs)} pairs (allowed {allowed}; {baseline['baseline_count']} at "
          f"{baseline['baseline_commit'][:7]}), {neuron} between neuron ops")
    if len(pairs) > allowed:
        print(f"duplicates: FAILED: {len(pairs)} duplicate pairs, more than the {allowed} allowed "
              f"(.ci/duplicates-baseline.json); factor the new copy out", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
