#!/usr/bin/env bash
# Pipeline under NCCL_MAX_P2P_NCHANNELS = default, 8, 2; DDP (captured, fp32) with 5 MB and
# 100 MB buckets. Logs under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
for ch in default 8 2; do
    ( [ $ch = default ] || export NCCL_MAX_P2P_NCHANNELS=$ch
      timeout 60 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/pipeline_channels.py \
          16384:32 4096:16 1024:8 2>&1 | grep "NCCL_MAX\|Error\|error" ) | tee -a "$OUT/pipeline-channels.txt"
done
for mb in 5 100; do
    timeout 70 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m spikefuse.bench.parallel_ddp --out "$OUT" \
        --modes captured,captured-local-bn --precisions fp32 --bucket-mb $mb --tag -bucket$mb --no-check 2>&1 \
        | grep "GPU fp32" | sed "s/^/bucket $mb MB: /" | tee -a "$OUT/ddp-buckets.txt"
done
