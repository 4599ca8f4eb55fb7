#!/usr/bin/env bash
# The 2026-11-25 GPU run behind gpu-tests-sparse-*, sparse-accuracy-seed*-*, sparse-cut05-* and
# sparse-kernel-captured-after-* (kept as it ran; gpu_next.sh's kernel and acc modes do the same).
source benchmarks/gpu_env.sh >/dev/null 2>&1
tag=$(python3 -c "import torch; print(torch.cuda.get_device_name().lower().replace(' ', '-'))")
mkdir -p $OUT/acc $OUT/kernel $OUT/cut05
SPIKEFUSE_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider -rf --tb=line tests/test_sparse_linear.py 2>&1 | grep -v Warn | tail -4 | tee $OUT/gpu-tests-sparse-$tag.txt
for seed in 0 1 2; do
  timeout 100 python3 benchmarks/sparse_accuracy.py $OUT/acc/seed$seed.json --seed $seed --sigma-u 1 --variants theta0.5 > $OUT/acc/seed$seed.txt 2>&1
  grep VERDICT $OUT/acc/seed$seed.txt; grep "theta0.5" $OUT/acc/seed$seed.txt | sed 's/test acc \[.*, \([0-9.]*\)\]/final \1/'
done
timeout 200 python3 -m spikefuse.cli bench sparse --out "$OUT/kernel" --cases ipu-shd:1:1:0.9 --modes dense --activity natural 2>&1 | grep "weight grad" 
timeout 200 python3 -m spikefuse.cli bench sparse --out "$OUT/cut05" --modes dense,sparse,auto --no-kernel --cases ipu-shd:4:1:0.5,ipu-shd:4:8:0.5,ipu-shd:16:1:0.5,ipu-shd:16:8:0.5 --activity natural 2>&1 | grep -v Warning | grep "step\|wrote"
