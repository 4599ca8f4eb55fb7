#!/usr/bin/env bash
# One device call for issues 3 and 4: the training-step and the data-loading benchmarks.
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=0
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/src:/tmp/site
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 290 python3 -m spikefuse.bench.train --out "$OUT" 2>&1 | tee "$OUT/bench-train.txt"
timeout 270 python3 -m spikefuse.bench.data --out "$OUT" 2>&1 | tee "$OUT/bench-data.txt"
