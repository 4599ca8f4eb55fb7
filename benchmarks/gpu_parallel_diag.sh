#!/usr/bin/env bash
# Second multi-GPU pass: where the pipeline's chunks, the eager SyncBN step and the exit of
# spikefuse train --gpus 2 lose their time. Logs under $OUT.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
timeout 120 python3 benchmarks/profile_pipeline_chunks.py 2>&1 | grep -v Warning > "$OUT/profile-pipeline-chunks.txt"
head -8 "$OUT/profile-pipeline-chunks.txt"; tail -3 "$OUT/profile-pipeline-chunks.txt"
timeout 150 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/profile_ddp_step.py \
    eager eager-local-bn captured 2>&1 | grep -v Warning > "$OUT/profile-ddp-step.txt"
grep "^==" "$OUT/profile-ddp-step.txt"
timeout 200 bash benchmarks/diagnose_exit.sh 2>&1 | tail -50
