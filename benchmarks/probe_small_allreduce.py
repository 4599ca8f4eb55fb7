"""Produces benchmarks/results/multi-gpu-*/symm-probe-*.json: NCCL against PyTorch's one-shot
all-reduce over GPU peer memory (torch.ops.symm_mem.one_shot_all_reduce_copy) for SyncBN-sized
payloads, eager and inside a CUDA graph, with the results cross-checked.
    OUT=DIR torchrun --standalone --nproc-per-node 2 benchmarks/probe_small_allreduce.py"""
import json, os, time
import torch, torch.distributed as dist

rank = int(os.environ["RANK"]); world = int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank); dev = torch.device("cuda", rank)
dist.init_process_group("nccl", device_id=dev)
group = dist.new_group(list(range(world)))
gname = group.group_name
out = {"torch": torch.__version__, "world": world}
try:
    import torch.distributed._symmetric_memory as symm
    if hasattr(symm, "enable_symm_mem_for_group"):
        symm.enable_symm_mem_for_group(gname)
    out["ops"] = {n: hasattr(torch.ops.symm_mem, n) for n in
                  ["one_shot_all_reduce", "one_shot_all_reduce_copy", "one_shot_all_reduce_out", "two_shot_all_reduce_"]}
except Exception as e:
    out["import_error"] = repr(e); symm = None

def timeit(fn, n=200):
    for _ in range(10): fn()
    torch.cuda.synchronize(); dist.barrier()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n * 1e3  # us

def graph_time(fn, per=20, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize(); dist.barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(per): fn()
    torch.cuda.synchronize(); dist.barrier()
    return timeit(g.replay, reps) / per

res = []
for dtype in (torch.float32, torch.float64, torch.bfloat16):
    for n in (129, 513, 1025, 3 * 1025):
        case = {"dtype": str(dtype), "numel": n}
        x = torch.randn(n, device=dev, dtype=torch.float32).to(dtype) + rank
        ref = x.clone(); dist.all_reduce(ref, group=group)
        y = x.clone()
        case["nccl_eager_us"] = timeit(lambda: dist.all_reduce(y, group=group))
        try:
            case["nccl_graph_us"] = graph_time(lambda: dist.all_reduce(y, group=group))
        except Exception as e:
            case["nccl_graph_error"] = repr(e)[:300]
        if symm is not None:
            try:
                bufs = [symm.empty(n, dtype=dtype, device=dev) for _ in range(2)]
                for b in bufs: symm.rendezvous(b, group)
                got = torch.ops.symm_mem.one_shot_all_reduce_copy(bufs[0], x, "sum", gname)
                torch.cuda.synchronize()
                case["symm_equal_nccl"] = bool(torch.equal(got, ref))
                case["symm_maxdiff"] = float((got.float() - ref.float()).abs().max())
                k = [0]
                def op():
                    k[0] ^= 1
                    return torch.ops.symm_mem.one_shot_all_reduce_copy(bufs[k[0]], x, "sum", gname)
                case["symm_eager_us"] = timeit(op)
                t0 = time.perf_counter()
                for _ in range(200): op()
                case["symm_host_us"] = (time.perf_counter() - t0) / 200 * 1e6
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(200): dist.all_reduce(y, group=group)
                case["nccl_host_us"] = (time.perf_counter() - t0) / 200 * 1e6
                torch.cuda.synchronize()
                try:
                    case["symm_graph_us"] = graph_time(op)
                    # correctness inside a graph
                    outbuf = [None]
                    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.stream(s):
                        op()
                    torch.cuda.synchronize(); dist.barrier()
                    with torch.cuda.graph(g):
                        outbuf[0] = op()
                    x.add_(1.0); ref2 = x.clone(); dist.all_reduce(ref2, group=group)
                    g.replay(); torch.cuda.synchronize()
                    case["symm_graph_equal"] = bool(torch.equal(outbuf[0], ref2))
                    x.sub_(1.0)
                except Exception as e:
                    case["symm_graph_error"] = repr(e)[:300]
            except Exception as e:
                case["symm_error"] = repr(e)[:300]
        res.append(case)
        if rank == 0: print(json.dumps(case), flush=True)
out["cases"] = res
if rank == 0:
    with open(os.path.join(os.environ.get("OUT", "."), f"symm-probe-{world}gpu.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({k: v for k, v in out.items() if k != "cases"}))
dist.destroy_process_group()
