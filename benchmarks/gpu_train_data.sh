#!/usr/bin/env bash
# One device call for issues 3 and 4: GPU check of the fused models, the training-step
# and data-loading benchmarks, and a profile of one fused step.
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=0
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/src:/tmp/site
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 100 python3 benchmarks/check_models_gpu.py 2>&1 | tee "$OUT/check-models-gpu.txt"
timeout 240 python3 -m spikefuse.bench.train --out "$OUT" 2>&1 | tee "$OUT/bench-train.txt"
timeout 150 python3 -m spikefuse.bench.data --out "$OUT" 2>&1 | tee "$OUT/bench-data.txt"
timeout 80 python3 benchmarks/profile_step.py > "$OUT/profile-step.txt" 2>&1; tail -3 "$OUT/profile-step.txt"
