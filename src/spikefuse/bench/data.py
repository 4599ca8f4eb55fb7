"""Data-loading benchmark: one training epoch of SHD-shaped data through four pipelines.

The recipe of "Training spiking neural networks, fast" (Lenz et al.): 700 -> 100 channels,
4 ms frames (at most 250 steps), Linear(100,128)-IF-Linear(128,128)-IF-Linear(128,128)-IF-
Linear(128,20), batch 128, Adam, cross-entropy on the output summed over time. Pipelines:
  a  tonic ToFrame in a DataLoader (workers, pinned memory), frames made per sample per epoch
  b  tonic DiskCachedDataset: frames made once, read back from per-sample HDF5 files
  c  spikefuse disk store: packed events memory-mapped, batch framed on the device
  d  spikefuse resident store: packed events on the device, sliced and framed there
c and d make several batches per framing pass (`SpikeDataset.batches(group=...)`), so the
host cost of the framing launches is paid once per group, not once per batch.
Each pipeline gets the same initial weights and sample order; its cache is built before
timing (and its build time reported), then a short untimed warm-up, then one timed epoch.

    python -m spikefuse.bench.data --out benchmarks/results [--samples N]
    spikefuse bench data --quick --out /tmp/bench   # a smoke test (CPU too): data-quick-<device>.*
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

import numpy as np
import torch
from torch import nn

CHANNELS, STEPS, WINDOW_US = 100, 250, 4000
# --quick: a smoke test (options left at their defaults take these): one framing pass of 2 batches
QUICK = {"samples": 16, "batch_size": 8, "workers": 0, "warmup": 1}
PIPELINES = {
    "a": "tonic ToFrame + DataLoader (workers, pinned)",
    "b": "tonic DiskCachedDataset + DataLoader",
    "c": "spikefuse disk store (mmap) + device framing",
    "d": "spikefuse resident store + device framing",
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="benchmarks/results", help="folder for the JSON + markdown results")
    parser.add_argument("--samples", type=int, default=None, help="train samples (default: all 8156)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=4, help="DataLoader workers of pipelines a and b")
    parser.add_argument("--warmup", type=int, default=3, help="untimed warm-up batches per pipeline")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--root", default="~/.cache/spikefuse/bench-data", help="cache folder")
    parser.add_argument("--pipelines", default="abcd", help="which of a, b, c, d to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--group", type=int, default=None,
                        help="batches framed per pass in c and d (default: the data set's default_group)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: unless given, --samples 16 --batch-size 8 --workers 0 --warmup 1; "
                             "written as data-quick-<device>")


# ---- the network -----------------------------------------------------------------------

def _if_neuron():
    from spikefuse.nn import IF

    return IF(threshold=1.0)


def make_model(seed: int, device) -> nn.Module:
    torch.manual_seed(seed)
    hidden = 128
    return nn.Sequential(
        nn.Linear(CHANNELS, hidden), _if_neuron(), nn.Linear(hidden, hidden), _if_neuron(),
        nn.Linear(hidden, hidden), _if_neuron(), nn.Linear(hidden, 20),
    ).to(device)


# ---- tonic pipelines (a, b) -----------------------------------------------------------

class TonicFramed(torch.utils.data.Dataset):
    """Synthetic SHD events through tonic's Downsample + ToFrame: int16 frames [T, 1, 100]."""

    def __init__(self, source):
        import tonic.transforms as tt

        self.source = source
        self.transform = tt.Compose([
            tt.Downsample(spatial_factor=CHANNELS / 700),
            tt.ToFrame(sensor_size=(CHANNELS, 1, 1), time_window=WINDOW_US, include_incomplete=True),
        ])

    def __len__(self):
        return len(self.source)

    def __getitem__(self, i):
        events, target = self.source[i]
        return self.transform(events), target


def pad_collate(batch):
    """Frames of a batch padded with zeros (or cut) to STEPS: x [T, B, 100] float32, y [B]."""
    x = torch.zeros(STEPS, len(batch), CHANNELS)
    for b, (frames, _) in enumerate(batch):
        f = torch.as_tensor(np.asarray(frames)[:STEPS]).reshape(-1, CHANNELS)
        x[:len(f), b] = f
    return x, torch.tensor([int(t) for _, t in batch], dtype=torch.int64)


def _loader(dataset, args, order_seed):
    cuda = torch.device(args.device).type == "cuda"
    return torch.utils.data.DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, collate_fn=pad_collate,
        generator=torch.Generator().manual_seed(order_seed), num_workers=args.workers,
        pin_memory=cuda, persistent_workers=args.workers > 0,
    )


# ---- spikefuse pipelines (c, d) -------------------------------------------------------

def _store(source, args):
    from spikefuse.data import Downsample, EventStore
    from spikefuse.data.cache import cached_store

    down = Downsample(spatial_factor=CHANNELS / 700)
    sensor = down.output_sensor_size((700, 1, 1))

    def build():
        return EventStore.from_samples((source[i] for i in range(len(source))), sensor, total=len(source),
                                       transform=down, desc="spikefuse store")
    params = {"source": "shd-synthetic", "seed": args.seed, "samples": len(source), "pre": repr(down)}
    return cached_store(args.root, "bench-shd-synthetic", "train", params, build, device=args.device)


def _spikefuse_batches(dataset, args, order_seed, group):
    gen = torch.Generator().manual_seed(order_seed)
    return lambda: dataset.batches(args.batch_size, shuffle=True, generator=gen, group=group)


def _batches_match_get(dataset, batch_size, seed, count=24):
    """The first `count` batches (groups made ahead on a side stream on a GPU) equal the
    same samples framed one batch at a time on the main stream."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))
    batches = dataset.batches(batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed))
    for i, (x, _) in zip(range(count), batches):
        if not torch.equal(x, dataset.get(order[i * batch_size:(i + 1) * batch_size])):
            return False
    return True


# ---- timing ---------------------------------------------------------------------------

def _epoch(batches, model, opt, device, limit=None):
    """Train over `batches`; returns (wall seconds, seconds inside training steps, steps).

    A training step is forward, loss, backward and optimizer step: on CUDA the GPU time
    between an event recorded before the forward and one after `opt.step()` (gaps where the
    GPU waits for the host's launches inside the step count as in the step). Wall time runs
    from a synchronized start to a synchronized end, so the difference is everything between
    steps: making the batch (host loading or device framing), copies, and idle GPU."""
    cuda = device.type == "cuda"
    spans, step_s = [], 0.0
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    steps = 0
    for x, y in batches:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if cuda:
            ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev[0].record()
        else:
            t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x).sum(0), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            ev[1].record()
            spans.append(ev)
        else:
            step_s += time.perf_counter() - t0
        steps += 1
        if limit is not None and steps >= limit:
            break
    if cuda:
        torch.cuda.synchronize(device)
        step_s = sum(a.elapsed_time(b) for a, b in spans) / 1e3
    return time.perf_counter() - start, step_s, steps


MAX_INT = 2**31 - 1  # counts: what an int32 index holds (the limit `spikefuse train` uses)
MAX_WORKERS = 1024  # DataLoader worker processes: more would only exhaust the machine


def usage_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the options, named as given (exit 2), or None: every option checked
    here, before anything is built (--samples 0 used to end in SyntheticSHD's ValueError, exit 1)."""
    from spikefuse.data.registry import check_device

    ranges = [("--samples", args.samples, 4, MAX_INT, True), ("--batch-size", args.batch_size, 1, MAX_INT, False),
              ("--workers", args.workers, 0, MAX_WORKERS, False), ("--warmup", args.warmup, 0, MAX_INT, False),
              ("--seed", args.seed, 0, 2**63 - 2, False), ("--group", args.group, 1, MAX_INT, True)]
    for flag, value, low, high, optional in ranges:
        if not (value is None and optional) and not (isinstance(value, int) and low <= value <= high):
            top = "2**63 - 2" if high == 2**63 - 2 else high
            return f"{flag}: expected an integer from {low} to {top}, got {value}"
    try:
        check_device(args.device)
    except ValueError as e:
        return f"--{e}"  # "device: ..." -> "--device: ..."
    unknown = [key for key in args.pipelines if key not in PIPELINES]
    if unknown or not args.pipelines:
        return f"--pipelines: expected some of a, b, c, d, got {args.pipelines!r}"
    return None


def run(args: argparse.Namespace) -> int:
    from spikefuse.bench.report import environment, table, write_results
    from spikefuse.data import ToFrame
    from spikefuse.data.dataset import EventSpikeDataset
    from spikefuse.data.synthetic import SyntheticSHD

    if args.quick:
        defaults = {"samples": None, "batch_size": 128, "workers": 4, "warmup": 3}
        for name, value in QUICK.items():
            if getattr(args, name) == defaults[name]:
                setattr(args, name, value)
    problem = usage_problem(args)
    if problem:
        print(f"spikefuse bench data: error: {problem}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    root = os.path.expanduser(args.root)
    source = SyntheticSHD("train", samples=args.samples, seed=args.seed)
    frame = ToFrame((CHANNELS, 1, 1), time_window=WINDOW_US, include_incomplete=True)
    order_seed = args.seed + 1
    results, first_batches, batches_match, skipped = {}, {}, {}, {}

    for key in args.pipelines:
        if key in "ab" and importlib.util.find_spec("tonic") is None:  # a peer: skipped with a note
            skipped[key] = "tonic is not installed"
            print(f"{key}: {PIPELINES[key]}: skipped, tonic is not installed")
            continue
        t0 = time.perf_counter()
        if key == "a":
            framed = TonicFramed(source)
            loader = _loader(framed, args, order_seed)
            make = lambda loader=loader: iter(loader)  # noqa: E731
            first = pad_collate([framed[i] for i in range(4)])[0]
        elif key == "b":
            import tonic

            path = os.path.join(root, f"tonic-disk-cache-{len(source)}-{args.seed}")
            cached = tonic.DiskCachedDataset(TonicFramed(source), cache_path=path)
            for _ in _loader(cached, args, order_seed):  # fill the cache (untimed, as in the paper)
                pass
            loader = _loader(cached, args, order_seed)
            make = lambda loader=loader: iter(loader)  # noqa: E731
            first = pad_collate([cached[i] for i in range(4)])[0]
        else:
            store = _store(source, args)
            if key == "d":
                store = store.to(device, resident=True)
            dataset = EventSpikeDataset(store, frame, STEPS, (CHANNELS,))
            group = args.group or dataset.default_group(args.batch_size)
            make = _spikefuse_batches(dataset, args, order_seed, group)
            first = dataset.get(torch.arange(4)).cpu()
            batches_match[key] = _batches_match_get(dataset, args.batch_size, order_seed)
        prepare_s = time.perf_counter() - t0

        first_batches[key] = first  # samples 0..3 framed by each pipeline: must be equal
        model = make_model(args.seed, device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        _epoch(make(), model, opt, device, limit=args.warmup)  # warm-up, untimed
        model = make_model(args.seed, device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        wall, in_step, steps = _epoch(make(), model, opt, device)
        results[key] = {"pipeline": PIPELINES[key], "prepare_s": prepare_s, "epoch_s": wall,
                        "train_step_s": in_step, "step_fraction": in_step / wall, "steps": steps}
        if key in "cd":
            results[key]["group"] = group
        print(f"{key}: {PIPELINES[key]}: epoch {wall:.2f} s, in training step {100 * in_step / wall:.0f}%")

    if not results:
        print(f"spikefuse bench data: error: --pipelines {args.pipelines}: none can run here: {skipped}",
              file=sys.stderr)
        return 2
    ref = next(iter(first_batches.values()))
    identical = all(torch.equal(ref, x) for x in first_batches.values()) and all(batches_match.values())
    ratios = {}
    if "a" in results and "d" in results:
        ratios = {"epoch_speedup_d_vs_a": results["a"]["epoch_s"] / results["d"]["epoch_s"],
                  "step_fraction_d_over_a": results["d"]["step_fraction"] / results["a"]["step_fraction"]}
    payload = {
        "benchmark": "data", "environment": environment(),
        "config": {"samples": len(source), "batch_size": args.batch_size, "workers": args.workers,
                   "channels": CHANNELS, "time_steps": STEPS, "window_us": WINDOW_US,
                   "warmup_batches": args.warmup, "device": str(device)},
        "results": results, "ratios": ratios, "frames_identical": identical,
        "grouped_batches_equal_single_gets": batches_match, "skipped": skipped, "quick": args.quick,
    }
    env = payload["environment"]
    rows = [[k, r["pipeline"], r["epoch_s"], 100 * r["step_fraction"], r.get("group"), r["prepare_s"]]
            for k, r in results.items()]
    clock = ("the GPU time between a CUDA event recorded before the forward and one recorded after "
             "the optimizer step, summed over the epoch's steps (GPU gaps inside a step while the host "
             "launches its kernels count as in the step)" if device.type == "cuda"
             else "the host wall clock around each step, summed (a CPU run)")
    md = (f"# Data-loading benchmark\n\n{env['device']}, torch {env['versions']['torch']}, "
          f"tonic {env['versions']['tonic']}, {env['date']}\n\n"
          f"SHD-shaped synthetic train split ({len(source)} samples), 700 -> 100 channels, 4 ms frames "
          f"(T = {STEPS}), batch {args.batch_size}, {args.workers} DataLoader workers for a and b; "
          f"one epoch after {args.warmup} warm-up batches.\n\n"
          f"% in train step = time in training steps / epoch wall time. A training step is forward, "
          f"loss, backward and Adam step; its time is {clock}. The epoch wall time runs on the host "
          f"clock from a synchronized start to a synchronized end, so the rest is what happens between "
          f"steps: making the batch (host loading or device framing), copies and idle GPU. "
          f"'batches per framing pass' is the group c and d frame at once; on a GPU the next group "
          f"is framed on a side stream while the current group's steps run.\n\n"
          + table(["", "pipeline", "epoch s", "% in train step", "batches per framing pass", "cache build s"], rows)
          + "".join(f"\n{k}: {v:.3g}" for k, v in ratios.items())
          + "".join(f"\n{k}: not run, {why}" for k, why in skipped.items())
          + f"\n\nFrames of samples 0-3 identical across pipelines, and the first grouped "
          f"batches of c and d equal to one-batch framing: {identical} {batches_match}\n")
    paths = write_results("data", payload, md, args.out)
    print("wrote", *paths)
    return 0 if identical else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spikefuse.bench.data", description=__doc__.splitlines()[0])
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
