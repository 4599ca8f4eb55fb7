set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=0
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD/src:/tmp/site
timeout 200 python3 -m spikefuse.bench.data --out "$OUT" 2>&1 | grep -v "sample/s\]" | tee "$OUT/bench-data.txt"
