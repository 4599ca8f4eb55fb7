"""Produces benchmarks/results/multi-gpu-*/ddp-ablation-*.json: where the 2-GPU captured
CIFAR-medium step's extra time goes. independent: each rank trains alone (no DDP) while the
other does too; noop-hook: DDP with a comm hook that sends nothing; any bench mode by name.
    OUT=DIR torchrun --standalone --nproc-per-node 2 benchmarks/ddp_ablation.py independent noop-hook captured-local-bn"""
import json, os, sys, torch
import spikefuse.bench.parallel_ddp as P
from spikefuse.parallel import init_data_parallel

dp = init_data_parallel("cuda")
P.precisions.applied("fp32").__enter__()  # as the bench runs
out = {}
wrap = type(dp).wrap

def noop(state, bucket):
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut

def wrap_noop(self, model, **kw):
    ddp = wrap(self, model, **kw)
    ddp.register_comm_hook(None, noop)
    return ddp

for rep in range(2):
    for name in sys.argv[1:]:
        torch.distributed.barrier()
        if name == "independent":
            case = P.measure("captured", "fp32", dp.device, None)
            t = torch.tensor([case["step_ms"]], device=dp.device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            case["step_ms"] = float(t)
        elif name == "noop-hook":
            type(dp).wrap = wrap_noop
            case = P.measure("captured-local-bn", "fp32", dp.device, dp)
            type(dp).wrap = wrap
        else:
            case = P.measure(name, "fp32", dp.device, dp)
        out[f"{name}#{rep}"] = case.get("step_ms")
        if dp.is_main:
            print(f"ablation {name} rep {rep}: {case.get('step_ms')} ms {case.get('error', '')}", flush=True)
if dp.is_main:
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "ddp-ablation.json"), "w"), indent=1)
torch.distributed.destroy_process_group()
