#!/usr/bin/env bash
# spikefuse train --gpus 2 did not exit after training (killed by timeout at 100 s): dump
# every process's Python stacks 20 s after training ends, captured and not captured.
source "$(dirname "$0")/gpu_env.sh"
export PYTHONFAULTHANDLER=1
for extra in "" "--no-capture"; do
    log=$OUT/exit${extra}.txt
    python3 -m spikefuse train --gpus 2 --epochs 1 --quiet --out /tmp/exit$extra $extra > "$log" 2>&1 &
    pid=$!
    for i in $(seq 1 60); do sleep 2; grep -q "test accuracy" "$log" && break; done
    start=$(date +%s)
    for i in $(seq 1 10); do sleep 2; kill -0 $pid 2>/dev/null || break; done
    if kill -0 $pid 2>/dev/null; then
        echo "STILL RUNNING $(( $(date +%s) - start )) s after training ($extra)" | tee -a "$log"
        ps -ef | grep -v grep | grep "spikefuse" | tee -a "$log"
        pkill -ABRT -f "spikefuse train"; sleep 3; pkill -9 -f "spikefuse train"
    else
        echo "exited $(( $(date +%s) - start )) s after training ($extra)" | tee -a "$log"
    fi
    grep -v Warning "$log" | tail -60
done
