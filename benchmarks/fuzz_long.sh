#!/bin/bash
# The longer fuzz run of tests/test_fuzz_properties.py, split over many cores (docs/reliability.md):
# one pytest per (entry point, SPIKEFUSE_FUZZ_SEED), each EXAMPLES examples over its 4 shards,
# through Triton's interpreter on the CPU, JOBS at a time; prints the examples run and the shard
# tests passed/failed per entry point (from each pytest's junit XML, kept under OUT).
#   bash benchmarks/fuzz_long.sh [SEEDS=10] [EXAMPLES=200] [JOBS=15] [OUT=fuzz-long]
SEEDS=${1:-10}; EX=${2:-200}; JOBS=${3:-15}; OUT=${4:-fuzz-long}
mkdir -p "$OUT"; export OUT SPIKEFUSE_TEST_DEVICE=cpu SPIKEFUSE_FUZZ_EXAMPLES=$EX CUDA_VISIBLE_DEVICES=
start=$(date +%s)
for k in $(seq 1 "$SEEDS"); do for t in lif plif alif cuba bn_lif; do echo "$t $k"; done; done |
  xargs -P "$JOBS" -n 2 sh -c 'SPIKEFUSE_FUZZ_SEED=$1 python -m pytest -q -n 0 -p no:cacheprovider \
    "tests/test_fuzz_properties.py::test_$0_fused_equals_reference" --junitxml="$OUT/$0-$1.xml" > "$OUT/$0-$1.txt" 2>&1
    echo "$0 seed $1: exit $?"'
echo "wall $(( $(date +%s) - start )) s"
python - "$OUT" <<'PY'
import collections, glob, sys, xml.etree.ElementTree as ET
examples, shards = collections.Counter(), collections.Counter()
for f in sorted(glob.glob(f"{sys.argv[1]}/*.xml")):
    name = f.split("/")[-1].rsplit("-", 1)[0]
    for case in ET.parse(f).getroot().iter("testcase"):
        examples[name] += sum(int(p.get("value")) for p in case.iter("property") if p.get("name") == "examples")
        shards[name, "failed" if case.find("failure") is not None or case.find("error") is not None else "passed"] += 1
for name in sorted(examples):
    print(f"{name}: {examples[name]} examples, shard tests passed {shards[name, 'passed']}, failed {shards[name, 'failed']}")
PY
