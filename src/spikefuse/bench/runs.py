"""`spikefuse bench runs`: whole training runs, spikefuse against SpikingJelly 2.0, snnTorch and
Norse, timed to accuracy (issue 38).

Per task (data set and network), every library trains the same network (bench.runs_peers: the
same layers, neuron equations and initial weights, copied from spikefuse's model layer by layer)
on the same data in the same order (the training split shuffled by a generator seeded with
seed + epoch, as spikefuse.train.Trainer draws it; the same batches), with the same recipe:
torch's Adam (fused on CUDA), one learning rate, cosine-annealed over --epochs, cross-entropy on
the logits, float32 with TF32 matmuls and convolutions (spikefuse.precision "fp32").
- spikefuse: spikefuse.train.Trainer as `fit` runs it, captured CUDA-graph steps on CUDA;
- SpikingJelly: its multi-step network stepped as its trainer's --execution-mode
  (bench.spikingjelly.training_step; default "graph", its fastest mode up to batch 48 in
  `bench steps`, torch.compile taking over from batch 128; eager on the CPU);
- snnTorch and Norse: their neurons stepped in a Python loop over time, the plain PyTorch step.
On CUDA each library's run is a fresh Python process (--isolation): it starts as a user's run
does, not with the kernels the libraries before it loaded; its data is loaded and the CUDA and
Triton start-up (context, cuBLAS and cuDNN handles, Triton's driver) paid before its clock.
Each library trains for --epochs (20) or until its wall time passes --time-cap seconds (checked
at the end of each epoch: the epoch under way finishes and is evaluated). Per epoch: wall time
since the run began (building the network, loading the initial weights, compilation, capture,
training and evaluation), training loss, test accuracy, peak GPU memory (None on the CPU).

Afterwards the target of a task is the lowest final test accuracy among the ranked libraries,
minus --margin points (1), and each library's time to it is read off its curve: the wall time at
the end of the first epoch whose test accuracy reached it, or "not reached". With --seeds N, each
task runs N times (seeds --seed, --seed + 1, ...: other initial weights and data orders, each with
its own target) and each library's headline is its median time to target over them, as MLPerf
ranks time to train: on a test curve that still oscillates near the target, the epoch that first
crosses it moves by several from seed to seed (and with float32 rounding, from library to library
at one seed), so one seed's ranking can be decided by that epoch rather than by the speed of each
epoch.

Equations cross-checked: per task and peer, on the initial weights and the first training batch
(train mode, float64 on both sides), the peer's spikes of every LIF layer and its gradients of
every parameter (loss: cross-entropy) against spikefuse's, with `bench on`'s tolerances. Float64,
since in float32 rounding alone flips a few spikes of a deep network, and each flip moves the
next batch norm's statistics: CIFAR-medium's nine LIF layers agreed 1.0, 0.999998, ..., 0.86,
0.76 layer by layer with every peer (H100, 2026-11-27). It runs
after the task's training runs, so that each library's first epoch includes its own kernels'
compilation (Triton, CuPy) as the issue asks; a library that fails it is reported and not ranked.
Each task's runs have a Triton cache of their own (--triton-cache-per-task, by default under
~/.cache/spikefuse), kept between invocations: a machine's first invocation gives cold-cache
first epochs on every task, a later one warm-cache ones; the results record which. With one cache
shared by all tasks, a task after the first would find the kernels the ones before it compiled:
SpikingJelly's LIF kernels serve every shape, spikefuse's are specialised to each network's, so
its first epochs would compile while SpikingJelly's load (an H100 run, 2026-11-27: the IPU net
2.10 against 0.93 s to target after the shd task).

    spikefuse bench runs --out benchmarks/results
    spikefuse bench runs --tasks randman:mlp --epochs 20 --time-cap 120
    spikefuse bench runs --quick --out /tmp/bench   # tiny, on the CPU too: checks the flow
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import pkgutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import precision as precisions
from ..data import embedded, load
from ..data.dataset import DenseSpikeDataset, Splits, StaticImageDataset
from ..data.synthetic import SyntheticSHD
from ..data.synthetic_images import NUM_CLASSES, SHAPE, SyntheticCIFAR
from ..errors import UsageError, one_line
from ..models import MODELS, build_model
from ..ops import compile_processes, launch
from ..ops.triton_or_stub import tl, triton
from ..train.loop import Trainer
from ..train.metrics import predicted
from ..train.spikes import SpikeMonitor
from . import options, runs_peers, spikingjelly
from .on import MAX_GRAD_REL_ERR, MAX_SPIKE_MISMATCH, compare, rel_err
from .atomic import atomic_write
from .report import environment, table, write_results
from .sparse_train import chart, time_to

LIBRARIES = ("spikefuse", *runs_peers.LIBRARIES)
# what each peer's networks import (bench.runs_peers): imported before any run, so that no
# library's clock counts its import, and a peer that does not import is skipped with the reason
PEER_MODULES = {"spikingjelly": "spikingjelly.activation_based.neuron", "snntorch": "snntorch", "norse": "norse.torch"}
LR = 2e-3  # `spikefuse train`'s default
EPOCHS, TIME_CAP_S, MARGIN = 20, 30.0, 1.0
QUICK_EPOCHS = 2
ISOLATION = ("auto", "process", "none")
# --triton-cache-per-task's default: per task, kept between invocations (cold on a machine's first)
TASK_CACHES = "~/.cache/spikefuse/bench-runs-triton"
CPU_NOTE = "CPU run: tiny sizes, wall-clock times, to check the flow; not the benchmark's figures (those need a CUDA GPU)"


@dataclass(frozen=True)
class Task:
    dataset: str
    model: str
    batch: int
    kwargs: dict = field(default_factory=dict)  # the model's size (full run)
    quick: dict = field(default_factory=dict)  # the model's size under --quick


# The tasks: shd-synthetic with `shd` and `ipu-shd` (the IPU study's batch), randman with
# `mlp`, CIFAR-medium on the synthetic images; each at its data set's own time steps.
TASKS = {
    "shd-synthetic:shd": Task("shd-synthetic", "shd", 64, quick={"width": 1 / 32}),
    "shd-synthetic:ipu-shd": Task("shd-synthetic", "ipu-shd", 48, quick={"width": 1 / 256}),
    "randman:mlp": Task("randman", "mlp", 64, quick={"hidden": (16, 16)}),
    "cifar-synthetic:cifar-medium": Task("cifar-synthetic", "cifar-medium", 64, quick={"width": 1 / 32}),
}
QUICK_BATCH = 16


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="benchmarks/results", help="folder for JSON, markdown and the charts")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated, of " + ", ".join(TASKS))
    parser.add_argument("--libraries", default=",".join(LIBRARIES),
                        help="comma-separated, of " + ", ".join(LIBRARIES) + " (spikefuse always runs)")
    parser.add_argument("--epochs", type=int, default=EPOCHS, help=f"epochs per library and task (default {EPOCHS})")
    parser.add_argument("--time-cap", type=float, default=TIME_CAP_S,
                        help=f"seconds per library and task, checked at each epoch's end (default {TIME_CAP_S:g}: "
                             "4 tasks x 4 libraries stay within `bench all`'s 10 minutes)")
    parser.add_argument("--lr", type=float, default=LR, help=f"Adam's learning rate, cosine-annealed (default {LR:g})")
    parser.add_argument("--seed", type=int, default=0, help="initial weights and data order (default 0)")
    parser.add_argument("--seeds", type=int, default=1,
                        help="run each task at this many seeds (--seed, --seed + 1, ...) and rank the libraries by "
                             "their median time to target over them (default 1)")
    parser.add_argument("--margin", type=float, default=MARGIN,
                        help=f"the target: the lowest final test accuracy minus this many points (default {MARGIN:g})")
    parser.add_argument("--spikingjelly-mode", default="graph",
                        help=f"SpikingJelly's execution mode, one of {', '.join(spikingjelly.MODES)} (default graph; "
                             "eager on the CPU)")
    parser.add_argument("--isolation", default="auto", choices=ISOLATION,
                        help="process: each library's run in a fresh Python process, as a user's run starts (its "
                             "CUDA context, lazily loaded kernels and allocator its own, the disk caches shared); "
                             "none: all in this process, each library finding what the ones before it loaded; "
                             "auto (default): process on CUDA, none on the CPU")
    parser.add_argument("--triton-cache-per-task", metavar="DIR", default=None,
                        help="each task's runs use Triton's cache DIR/<task> (created where absent): a first "
                             "invocation measures every task (and seed) cold, as on a machine's first run, and a "
                             "second one warm (default with --isolation process: "
                             f"{TASK_CACHES}); 'shared': all tasks share this process's cache, so a task after "
                             "the first finds the kernels the ones before it compiled, which favours the library "
                             "whose kernels serve every shape (each task's results record its cache's state). "
                             "Needs --isolation process")
    parser.add_argument("--background-compile", choices=["on", "off"], default="on",
                        help="spikefuse's Trainer(background_compile=...) on CUDA: on (default), its layers run quick "
                             "kernels (LIF) or their torch twins while their kernels compile; off, every kernel "
                             "compiles before it runs")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                        help="auto (default): cuda where present; cpu runs only with --quick (the harness at toy sizes)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke test: tiny data and networks, {QUICK_EPOCHS} epochs, on the CPU too; written "
                             "as runs-quick-<device>")


def check_args(args) -> tuple[list[str], list[str], str]:
    """(tasks, libraries, SpikingJelly's mode); UsageError naming the bad option, before the
    device is looked at."""
    tasks = options.names("--tasks", args.tasks, TASKS)
    libraries = ["spikefuse"] + [n for n in options.names("--libraries", args.libraries, LIBRARIES) if n != "spikefuse"]
    options.count("--epochs", args.epochs)
    options.number("--time-cap", args.time_cap, low_open=0.0)
    options.rate("--lr", args.lr)
    options.seed("--seed", args.seed)
    options.count("--seeds", args.seeds)
    options.number("--margin", args.margin, low=0, high=100)
    modes = options.names("--spikingjelly-mode", args.spikingjelly_mode, spikingjelly.MODES)
    if len(modes) != 1:
        raise UsageError(f"--spikingjelly-mode {args.spikingjelly_mode}: name one of {', '.join(spikingjelly.MODES)}")
    return tasks, libraries, modes[0]


# ---- data ----

def load_data(name: str, device, quick: bool) -> Splits:
    """The task's data set; under --quick a few samples of it, at fewer time steps."""
    if not quick:
        return load(name, device=device, progress=False)
    if name == "shd-synthetic":
        # few events a sample (its default is 3000): framing them is most of a CPU run's time
        pair = (SyntheticSHD("train", samples=48, seed=0, mean_events=400),
                SyntheticSHD("test", samples=24, seed=0, mean_events=400))
        return load(pair, time_steps=20, framing="window", device=device, progress=False)
    if name == "randman":
        x_tr, y_tr, x_te, y_te = (t.to(device) for t in embedded.randman(time_steps=20, samples_per_class=6, seed=0))
        train, test = DenseSpikeDataset(x_tr, y_tr), DenseSpikeDataset(x_te, y_te)
        return Splits(name, train, test, 10, train.input_shape, 20)
    parts = [SyntheticCIFAR(split, samples=n, seed=0).arrays() for split, n in (("train", 32), ("test", 16))]
    train, test = (StaticImageDataset(torch.from_numpy(x).to(device), torch.from_numpy(y), 2) for x, y in parts)
    return Splits(name, train, test, NUM_CLASSES, SHAPE, 2)


# ---- the runs ----

@dataclass
class Setting:
    """What every run of a task shares."""
    task: str
    splits: Splits
    state: dict  # spikefuse's initial weights (every library starts from them)
    model_kwargs: dict
    batch: int
    args: argparse.Namespace
    device: torch.device
    sj_mode: str
    isolated: bool = False  # each library's run in its own process (run_isolated)
    triton_cache: str | None = None  # the task's own Triton cache directory (--triton-cache-per-task)

    def build(self):
        spec = TASKS[self.task]
        model = build_model(spec.model, self.splits.input_shape, self.splits.num_classes, self.splits.time_steps,
                            **self.model_kwargs, **runs_peers.SURROGATE).to(self.device)
        model.load_state_dict(self.state)
        return model

    def row(self, library: str) -> dict:
        """A run's record, shaped as bench.sparse_train's rows (its time_to and chart read it)."""
        width = self.model_kwargs.get("width", 1.0)
        return {"task": self.task, "net": TASKS[self.task].model, "width": width, "B": self.batch,
                "seed": self.args.seed, "run": library, "status": "ran", "setup_s": 0.0, "epochs": [],
                "stopped_by": None, "time_cap_s": self.args.time_cap}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_mib(device):
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def _reset_peak(device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


class Clock:
    """Wall time since the run began; per epoch the time since the last epoch ended."""

    def __init__(self, device):
        self.device = device
        _sync(device)
        _reset_peak(device)
        self.start = self.last = time.perf_counter()

    def lap(self) -> float:
        _sync(self.device)
        now = time.perf_counter()
        lap, self.last = now - self.last, now
        return lap

    def wall(self) -> float:
        return self.last - self.start


def _epoch(row, clock, number, train_loss, test_acc, train_acc=None, **extra):
    """Append an epoch to `row` (with `extra`'s entries); True when the run's budget is spent."""
    lap = clock.lap()
    row["epochs"].append({"epoch": number, "epoch_time_s": lap, "wall_s": clock.wall(), "train_loss": train_loss,
                          "train_acc": train_acc, "test_acc": test_acc, "peak_mib": _peak_mib(clock.device), **extra})
    _reset_peak(clock.device)  # the next epoch's peak is its own
    if clock.wall() >= row["time_cap_s"]:
        row["stopped_by"] = "time cap"
        return True
    return False


def run_spikefuse(setting: Setting, row: dict) -> None:
    """Trainer.fit as a user runs it (captured on CUDA), one epoch per call so that the time cap
    can stop it between epochs (fit continues from the epoch it reached)."""
    args, device = setting.args, setting.device
    clock = Clock(device)
    model = setting.build()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, fused=device.type == "cuda" or None)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    trainer = Trainer(model, setting.splits, optimizer, epochs=args.epochs, batch_size=setting.batch,
                      scheduler=scheduler, device=device, precision="fp32", seed=args.seed, progress=False,
                      background_compile=_background(args, device))
    row["setup_s"] = clock.lap()
    row["implementation"] = ("Trainer.fit, " + ("captured CUDA-graph steps" if trainer.step.enabled else "eager steps")
                             + (", background compiles" if trainer.background_compile else ""))
    for epoch in range(args.epochs):
        trainer.epochs = epoch + 1
        record = trainer.fit()[-1]
        # where the first epochs' time goes: launches that ran a torch twin (so far), graphs captured
        if _epoch(row, clock, epoch + 1, record["train_loss"], record["test_acc"], record["train_acc"],
                  deferred_launches=launch.deferrals(), captured_graphs=trainer.step.captured):
            return


def _background(args, device) -> bool:
    """Whether spikefuse trains with background compiles: on CUDA unless --background-compile off."""
    return device.type == "cuda" and getattr(args, "background_compile", "on") == "on"


def run_peer(setting: Setting, row: dict, ops) -> None:
    """The peer's network from the initial weights, trained in a plain loop: the same batches,
    optimizer, schedule and evaluation as Trainer's."""
    args, device, library = setting.args, setting.device, row["run"]
    clock = Clock(device)
    peer = runs_peers.PeerNet(ops, library)
    runs_peers.copy_weights(ops, peer)
    peer.to(device)
    optimizer = torch.optim.Adam(peer.parameters(), lr=args.lr, fused=device.type == "cuda" or None)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    mode = setting.sj_mode if library == "spikingjelly" else "eager"
    step = spikingjelly.training_step(peer, optimizer, "fp32", mode)
    generator = torch.Generator()
    row["setup_s"] = clock.lap()
    row["implementation"] = runs_peers.implementation(peer, device) + (f", {mode} steps" if library == "spikingjelly" else "")
    train, test = setting.splits.train, setting.splits.test
    with precisions.applied("fp32"):
        for epoch in range(args.epochs):
            peer.train()
            generator.manual_seed(args.seed + epoch)  # Trainer's order
            loss_sum = torch.zeros((), dtype=torch.float64, device=device)
            for x, y in train.batches(setting.batch, shuffle=True, generator=generator):
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                loss_sum += step(x, y).detach().double() * len(y)
            train_loss = loss_sum.item() / len(train)
            test_acc = evaluate(peer, test, setting.batch, device)
            scheduler.step()
            if _epoch(row, clock, epoch + 1, train_loss, test_acc):
                return


@torch.no_grad()
def evaluate(model, data, batch: int, device) -> float:
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    for x, y in data.batches(batch, shuffle=False):
        correct += (predicted(model(x.to(device)).float()) == y.to(device)).sum()
    return correct.item() / len(data)


def run_library(setting: Setting, library: str, ops) -> dict:
    row = setting.row(library)
    try:
        if library == "spikefuse":
            run_spikefuse(setting, row)
        else:
            run_peer(setting, row, ops)
        row["stopped_by"] = row["stopped_by"] or "epochs"
    except Exception as error:  # noqa: BLE001 -- out of memory, a peer's kernel failing: a row, the rest still run
        row.update(status="failed", error=one_line(error))
    finally:
        if setting.device.type == "cuda":  # the next run starts with the GPU memory this one held given back
            gc.collect()
            torch.cuda.empty_cache()
    return row


def isolation_of(args, device) -> str:
    """--isolation resolved: "process" or "none"."""
    if args.isolation != "auto":
        return args.isolation
    return "process" if device.type == "cuda" else "none"


def run_isolated(setting: Setting, library: str) -> dict:
    """run_library in a fresh Python process (worker): every library starts as a user's run
    does, with its own CUDA context, lazily loaded kernels and allocator, rather than with what
    the libraries before it loaded (spikefuse runs first and loaded the data pipeline's, the
    loss's and the optimizer's kernels for all). The disk caches (Triton's, the data's) are shared."""
    with tempfile.TemporaryDirectory(prefix="spikefuse-runs-") as folder:
        spec, result = os.path.join(folder, "spec.pt"), os.path.join(folder, "row.json")
        torch.save({"task": setting.task, "library": library, "state": {k: v.cpu() for k, v in setting.state.items()},
                    "model_kwargs": setting.model_kwargs, "batch": setting.batch,
                    "args": {k: v for k, v in vars(setting.args).items() if isinstance(v, (str, int, float, type(None)))},
                    "device": str(setting.device), "sj_mode": setting.sj_mode, "spawned_at": time.time()}, spec)
        code = f"from spikefuse.bench.runs import worker; worker({spec!r}, {result!r})"
        env = None if setting.triton_cache is None else {**os.environ, "TRITON_CACHE_DIR": setting.triton_cache}
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", code], check=False, env=env)
        if done.returncode == 0 and os.path.exists(result):
            with open(result) as f:
                row = json.load(f)
            row["process"]["total_s"] = time.perf_counter() - started  # exit included
            return row
    row = setting.row(library)
    row.update(status="failed", error=f"its process ended with exit code {done.returncode} (its output says why)")
    return row


def worker(spec_path: str, result_path: str) -> None:
    """One library's run in this process, for run_isolated: the data loaded (from the disk cache
    the parent filled) and the process's one-time costs paid before its clock starts, as in the
    parent; the row written to result_path."""
    spec = torch.load(spec_path, weights_only=True)
    phases, last = {"start_s": time.time() - spec["spawned_at"]}, time.perf_counter()  # Python, torch, this module

    def phase(name):
        nonlocal last
        now = time.perf_counter()
        phases[name], last = now - last, now

    args, device, library = argparse.Namespace(**spec["args"]), torch.device(spec["device"]), spec["library"]
    splits = load_data(TASKS[spec["task"]].dataset, device, args.quick)
    phase("data_s")
    skipped = import_peers([library])
    if library in skipped:
        raise RuntimeError(skipped[library])
    import_spikefuse()
    phase("imports_s")
    warm_device(device)
    phase("warm_device_s")
    setting = Setting(spec["task"], splits, spec["state"], spec["model_kwargs"], spec["batch"], args, device,
                      spec["sj_mode"])
    ops = runs_peers.network_ops(setting.build()) if library != "spikefuse" else None
    row = run_library(setting, library, ops)
    phase("run_s")
    row["process"] = phases  # where a run's process spends the time outside its clock (bench all's budget)
    atomic_write(result_path, json.dumps(row))


# ---- the cross-check of equations ----

def cross_check(setting: Setting, library: str) -> dict:
    """The peer's spikes of every LIF layer and gradients of every parameter against spikefuse's,
    both from the initial weights on the first training batch, in train mode, in float64 (the
    equations, not the precision, are checked; spikefuse takes its reference path there)."""
    device = setting.device
    generator = torch.Generator().manual_seed(setting.args.seed)
    x, y = next(iter(setting.splits.train.batches(setting.batch, shuffle=True, generator=generator)))
    x, y = x.to(device, torch.float64), y.to(device)
    with precisions.applied("fp32-strict"):
        model = setting.build().double()
        ops = runs_peers.network_ops(model)
        peer = runs_peers.PeerNet(ops, library)
        pairs = runs_peers.copy_weights(ops, peer)  # before either forward updates a batch norm's statistics
        peer.to(device, torch.float64)  # in place: the pairs keep pointing at its parameters
        with SpikeMonitor(model, keep=True) as monitor:
            logits = model(x)
        F.cross_entropy(logits, y).backward()
        peer.record = True
        peer_logits = peer(x)
        F.cross_entropy(peer_logits, y).backward()
    ours = list(monitor.trains.values())
    if len(ours) != len(peer.recorded):
        raise AssertionError(f"{library}: {len(peer.recorded)} LIF layers, spikefuse {len(ours)}")
    agreement = [compare(theirs.cpu(), mine) for theirs, mine in zip(peer.recorded, ours)]
    grads = {name: rel_err(dest.grad, source.grad) for name, source, dest in pairs}
    del model, peer
    return {"spike_agreement": agreement, "spikes_equal": all(a == 1.0 for a in agreement),
            "grad_rel_err": grads, "logits_rel_err": rel_err(peer_logits.detach(), logits.detach()),
            "passed": min(agreement) >= 1 - MAX_SPIKE_MISMATCH and max(grads.values()) <= MAX_GRAD_REL_ERR}


# ---- targets and times to them ----

def target_of(finals: list[float], margin_points: float) -> float | None:
    """The lowest final test accuracy minus `margin_points` points (None without any)."""
    return min(finals) - margin_points / 100 if finals else None


def summarise(rows: list[dict], checks: dict, margin_points: float) -> dict:
    """The task's target (from the ranked libraries: those that ran and passed the cross-check,
    spikefuse being the reference), and per library with an epoch: final and best test accuracy,
    time to target (None: not reached; also for a library not ranked, as information), ratio to
    spikefuse's time, peak memory, epochs run; for one not ranked, why."""
    ranked = [r for r in rows if r["status"] == "ran" and r["epochs"]
              and (r["run"] == "spikefuse" or checks.get(r["run"], {}).get("passed"))]
    target = target_of([r["epochs"][-1]["test_acc"] for r in ranked], margin_points)
    times = {r["run"]: time_to(r, target) for r in rows if r["epochs"] and target is not None}
    ours = times.get("spikefuse")
    libraries = {}
    for r in rows:
        entry = {"status": r["status"], "ranked": any(r is x for x in ranked)}
        if r["status"] != "ran" or not r["epochs"]:
            entry["why_not_ranked"] = r.get("error") or r.get("reason") or "no epoch finished"
        elif not entry["ranked"]:
            check = checks.get(r["run"], {})
            entry["why_not_ranked"] = ("cross-check failed: " + check["error"] if "error" in check
                                       else "cross-check failed: spikes or gradients differ from spikefuse's")
        if r["epochs"]:
            peaks = [e["peak_mib"] for e in r["epochs"] if e["peak_mib"] is not None]
            t = times.get(r["run"])
            entry.update(final_test_acc=r["epochs"][-1]["test_acc"], best_test_acc=max(e["test_acc"] for e in r["epochs"]),
                         epochs=len(r["epochs"]), stopped_by=r["stopped_by"], wall_s=r["epochs"][-1]["wall_s"],
                         first_epoch_s=r["setup_s"] + r["epochs"][0]["epoch_time_s"],
                         peak_mib=max(peaks) if peaks else None, time_to_target_s=t,
                         x_spikefuse=t / ours if t is not None and ours else None)
        libraries[r["run"]] = entry
    ranking = sorted((r["run"] for r in ranked if times.get(r["run"]) is not None), key=lambda n: times[n])
    return {"target": target, "margin_points": margin_points, "ranking": ranking,
            "not_reached": [n for n, t in times.items() if t is None], "libraries": libraries}


def medians(results: list[dict]) -> dict:
    """Per task run at several seeds: per library ranked at one of them, its time to target at each
    seed (None: not reached or not ranked there) and the median over the seeds (a seed without a
    time counting as never: the median is None where most seeds have none), with the ratio to
    spikefuse's median; the libraries ranked by it."""
    tasks = {}
    for result in results:
        tasks.setdefault(result["task"], []).append(result)
    out = {}
    for task, runs in tasks.items():
        names = list(dict.fromkeys(n for r in runs for n, e in r["summary"]["libraries"].items() if e["ranked"]))
        libraries = {}
        for name in names:
            entries = [r["summary"]["libraries"].get(name, {}) for r in runs]
            times = [e.get("time_to_target_s") if e.get("ranked") else None for e in entries]
            middle = statistics.median(float("inf") if t is None else t for t in times)
            libraries[name] = {"times_s": times, "median_s": None if middle == float("inf") else middle}
        ours = libraries.get("spikefuse", {}).get("median_s")
        for entry in libraries.values():
            entry["x_spikefuse"] = entry["median_s"] / ours if entry["median_s"] is not None and ours else None
        ranking = sorted((n for n, e in libraries.items() if e["median_s"] is not None),
                         key=lambda n: libraries[n]["median_s"])
        out[task] = {"seeds": [r["seed"] for r in runs], "targets": [r["summary"]["target"] for r in runs],
                     "libraries": libraries, "ranking": ranking}
    return out


# ---- the benchmark ----

def import_peers(libraries) -> dict:
    """Import the peers asked for; those that do not import, and why (each is skipped)."""
    skipped = {}
    for name in (n for n in libraries if n != "spikefuse"):
        try:
            with warnings.catch_warnings():  # their import-time deprecation notices (torch.jit.script) are theirs
                warnings.simplefilter("ignore")
                importlib.import_module(PEER_MODULES[name])
        except ImportError as error:
            skipped[name] = f"not installed ({PEER_MODULES[name]} does not import: {one_line(error)})"
        except Exception as error:  # noqa: BLE001 -- a broken install is a skip with its reason, not the end
            skipped[name] = f"failed to import {PEER_MODULES[name]}: {one_line(error)}"
    return skipped


def import_spikefuse() -> None:
    """spikefuse's kernel modules, which its layers import at their first forward: imported
    here as the peers are, so that no library's clock counts its import."""
    from .. import ops
    for module in pkgutil.iter_modules(ops.__path__):
        importlib.import_module(f"{ops.__name__}.{module.name}")


def triton_cache_state(path: str | None = None) -> dict:
    """Where Triton keeps compiled kernels (`path`, default this process's cache), and how many
    entries it held as the run began: none (a cold cache, as on a machine's first run) means every
    Triton kernel, spikefuse's and SpikingJelly's, was compiled within its library's first epoch;
    otherwise those an earlier run compiled were loaded from disk (a warm cache, as on every later run)."""
    path = compile_processes.cache_dir() if path is None else path
    entries = len(os.listdir(path)) if path and os.path.isdir(path) else 0
    return {"dir": path, "entries_at_start": entries, "state": "warm" if entries else "cold",
            "speculative_compiles": launch.speculation_enabled()}


def warm_device(device) -> None:
    """The process's one-time costs paid before the first run, so that they fall on no library's
    clock (the first library would pay them for all): the CUDA context, cuBLAS and cuDNN handles,
    and Triton's (its driver, the hash of its own sources in every cache key, its CUDA helper
    module), which spikefuse and SpikingJelly both use."""
    if device.type != "cuda":
        return
    a = torch.randn(64, 64, device=device, requires_grad=True)
    (a @ a).sum().backward()
    conv = torch.nn.Conv2d(3, 8, 3).to(device)
    conv(torch.randn(2, 3, 8, 8, device=device)).sum().backward()
    x = torch.zeros(8, device=device)
    _add_one[(1,)](x, 8, BLOCK=8)
    _sync(device)


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1.0, mask=i < n)


def run(args) -> int:
    tasks, libraries, sj_mode = check_args(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here (--device cpu --quick runs the harness "
                         "at toy sizes)")
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if not cuda and not args.quick:
        raise UsageError("spikefuse bench runs needs a CUDA device (or --quick, tiny sizes on the CPU)")
    device = torch.device("cuda" if cuda else "cpu")
    if args.quick:
        args.epochs = QUICK_EPOCHS
    if not cuda and sj_mode == "graph":
        sj_mode = "eager"  # its StaticCudaGraph needs CUDA
    task_caches = task_caches_of(args, device)
    skipped = import_peers(libraries)
    import_spikefuse()
    cache = triton_cache_state()  # before warm_device's kernel enters it
    warm_device(device)
    results, data = [], {}
    for name in tasks:
        spec = TASKS[name]
        if spec.dataset not in data:  # shd-synthetic serves two tasks
            data[spec.dataset] = load_data(spec.dataset, device, args.quick)
        for seed in seeds_of(args):
            folder = _task_cache(task_caches, name, seed if args.seeds > 1 else None)
            task_cache = triton_cache_state(folder)  # each task's own (shared: one after the first finds kernels)
            at_seed = argparse.Namespace(**{**vars(args), "seed": seed})
            result = run_task(name, data[spec.dataset], libraries, skipped, sj_mode, at_seed, device, folder)
            result["triton_cache"] = task_cache
            results.append(result)
            paths = save(args, device, sj_mode, results, skipped, cache)  # after every run: one cut short keeps these
        if args.seeds > 1:
            print(median_line(name, medians(results)[name]), flush=True)
    charts = write_charts(results, os.path.splitext(paths[0])[0], args.quick)
    print("wrote", *paths, *charts)
    return 0


def seeds_of(args) -> list[int]:
    return list(range(args.seed, args.seed + args.seeds))


def task_caches_of(args, device) -> str | None:
    """--triton-cache-per-task resolved: the folder of the tasks' own caches, or None (shared)."""
    given = args.triton_cache_per_task
    process = isolation_of(args, device) == "process"
    if given is not None and given != "shared" and not process:
        raise UsageError("--triton-cache-per-task needs --isolation process (the default on CUDA): Triton "
                         "reads its cache directory in each library's own process")
    if given == "shared" or (given is None and not process):
        return None
    return os.path.expanduser(given if given is not None else TASK_CACHES)


def _task_cache(root: str | None, task: str, seed: int | None = None) -> str | None:
    """--triton-cache-per-task's directory for `task` (and `seed`, under --seeds: each seed's
    runs as cold as the first's) (created), or None."""
    if root is None:
        return None
    folder = os.path.join(os.path.abspath(root), task.replace(":", "-") + ("" if seed is None else f"-seed{seed}"))
    os.makedirs(folder, exist_ok=True)
    return folder


def run_task(name, splits, libraries, skipped, sj_mode, args, device, triton_cache=None) -> dict:
    spec = TASKS[name]
    model_kwargs = spec.quick if args.quick else spec.kwargs
    batch = QUICK_BATCH if args.quick else spec.batch
    torch.manual_seed(args.seed)  # the initial weights every library starts from
    model = build_model(spec.model, splits.input_shape, splits.num_classes, splits.time_steps,
                        **model_kwargs, **runs_peers.SURROGATE).to(device)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ops = runs_peers.network_ops(model)  # `model` keeps the initial weights: the peers copy them
    setting = Setting(name, splits, state, model_kwargs, batch, args, device, sj_mode,
                      isolation_of(args, device) == "process", triton_cache)
    begun = time.perf_counter()
    rows = []
    for library in libraries:
        if library in skipped:
            rows.append({**setting.row(library), "status": "skipped", "reason": skipped[library]})
            continue
        rows.append(run_isolated(setting, library) if setting.isolated else run_library(setting, library, ops))
        print(line(rows[-1]), flush=True)
    checks = {}
    for row in rows:  # after the runs: each library's first epoch compiled its own kernels (module docstring)
        if row["run"] == "spikefuse" or row["status"] == "skipped":
            continue
        checking = time.perf_counter()
        try:
            checks[row["run"]] = cross_check(setting, row["run"])
        except Exception as error:  # noqa: BLE001 -- a peer that cannot run the check is not ranked
            checks[row["run"]] = {"passed": False, "error": one_line(error)}
        check = checks[row["run"]]
        check["seconds"] = time.perf_counter() - checking
        print(f"{name} {row['run']}: cross-check " + ("passed" if check["passed"] else "FAILED")
              + (f" ({check['error']})" if "error" in check else
                 f", spike agreement {min(check['spike_agreement']):.6f}, "
                 f"largest gradient error {max(check['grad_rel_err'].values()):.2e}"), flush=True)
    summary = summarise(rows, checks, args.margin)
    print(summary_line(name, summary), flush=True)
    return {"task": name, "seed": args.seed, "dataset": spec.dataset, "model": spec.model, "network": MODELS[spec.model][1],
            "model_kwargs": model_kwargs, "T": splits.time_steps, "B": batch, "train_samples": len(splits.train),
            "test_samples": len(splits.test), "neurons": runs_peers.equations(ops), "cross_check": checks,
            "runs": rows, "summary": summary, "seconds": time.perf_counter() - begun}


def save(args, device, sj_mode, results, skipped, cache):
    """runs-<device>.json and .md with the tasks run so far; their paths."""
    payload = {
        "benchmark": "runs", "environment": environment(), "device_type": device.type, "quick": args.quick,
        "note": None if device.type == "cuda" else CPU_NOTE,
        "recipe": {"epochs": args.epochs, "time_cap_s": args.time_cap, "seed": args.seed, "seeds": seeds_of(args),
                   "lr": args.lr,
                   "optimizer": "torch.optim.Adam" + (" (fused)" if device.type == "cuda" else ""),
                   "schedule": f"cosine annealing over {args.epochs} epochs", "loss": "cross-entropy on the logits",
                   "precision": "fp32 (TF32 matmuls and convolutions where the GPU has them)",
                   "margin_points": args.margin, "isolation": isolation_of(args, device),
                   "spikefuse": "spikefuse.train.Trainer.fit" + (", captured CUDA-graph steps" if device.type == "cuda"
                                                                 else ", eager steps")
                                + (", background compiles" if _background(args, device) else ""),
                   "spikingjelly_mode": sj_mode, "snntorch": "Leaky in a Python loop over time, plain PyTorch step",
                   "norse": "LIFBoxCell in a Python loop over time, plain PyTorch step",
                   "data_order": "training split shuffled by torch.Generator(seed + epoch), as Trainer; same batches",
                   "wall_time": "from the start of the run (network built, initial weights loaded) to each epoch's end: "
                                "compilation, capture, training and evaluation"},
        "equations": runs_peers.EQUATIONS,
        "tolerances": {"spike_mismatch": MAX_SPIKE_MISMATCH, "grad_rel_err": MAX_GRAD_REL_ERR,
                       "check": "per peer and task, on the initial weights and the first training batch, "
                                "train mode, float64 on both sides, after the task's runs"},
        "triton_cache": cache, "skipped_libraries": skipped, "tasks": results,
        "medians": medians(results) if args.seeds > 1 else None,
    }
    return write_results("runs", payload, markdown(payload), args.out)


def write_charts(results, base: str, quick: bool) -> list[str]:
    """One PNG per task, <base>-<task>.png: test accuracy against wall time, one line per library,
    the target dashed."""
    written, charted = [], set()
    for result in results:
        if result["task"] in charted:  # under --seeds, the first seed's runs
            continue
        charted.add(result["task"])
        rows = [dict(r, run=r["run"] + ("" if result["summary"]["libraries"][r["run"]]["ranked"] else " (not ranked)"))
                for r in result["runs"] if r["epochs"]]
        if rows:
            case = (rows[0]["task"], rows[0]["net"], rows[0]["width"], rows[0]["B"])
            path = chart(rows, f"{base}-{result['task'].replace(':', '-')}.png", quick=quick,
                         targets={case: result["summary"]["target"]})
            written += [path] if path else []
    return written


def line(row) -> str:
    if row["status"] != "ran":
        return f"{row['task']} {row['run']}: {row['status']} ({row.get('error') or row.get('reason')})"
    e = row["epochs"]
    return (f"{row['task']} {row['run']}: {len(e)} epochs in {e[-1]['wall_s']:.1f} s (stopped by "
            f"{row['stopped_by']}; first epoch {row['setup_s'] + e[0]['epoch_time_s']:.1f} s with set-up), "
            f"test {e[-1]['test_acc']:.2%} (best {max(x['test_acc'] for x in e):.2%})")


def summary_line(name, summary) -> str:
    if summary["target"] is None:
        return f"{name}: no library finished an epoch and passed the cross-check: no target"
    times = ", ".join(f"{n} {summary['libraries'][n]['time_to_target_s']:.2f} s" for n in summary["ranking"])
    unranked = [n for n, e in summary["libraries"].items() if not e["ranked"]]
    return (f"{name}: target {summary['target']:.2%}; time to it: {times}"
            + (f"; not reached: {', '.join(summary['not_reached'])}" if summary["not_reached"] else "")
            + (f"; not ranked: {', '.join(unranked)}" if unranked else ""))


def median_line(name, median) -> str:
    times = ", ".join(f"{n} {median['libraries'][n]['median_s']:.2f} s" for n in median["ranking"])
    never = [n for n, e in median["libraries"].items() if e["median_s"] is None]
    return (f"{name}: median time to target over seeds {', '.join(map(str, median['seeds']))}: {times}"
            + (f"; not reached at most seeds: {', '.join(never)}" if never else ""))


def _pct(value):
    return "-" if value is None else f"{value:.2%}"


def markdown(payload) -> str:
    env, recipe = payload["environment"], payload["recipe"]
    out = [f"# Whole training runs: time to accuracy\n\n{env['device']}, {env['date']}, versions {env['versions']}\n"]
    if payload["note"]:
        out.append(f"**{payload['note']}.**\n")
    out.append(f"Recipe (every library): {recipe['optimizer']} lr {recipe['lr']:g}, {recipe['schedule']}, "
               f"{recipe['loss']}, {recipe['precision']}; at most {recipe['epochs']} epochs or "
               f"{recipe['time_cap_s']:g} s per library and task (checked at each epoch's end); data order: "
               f"{recipe['data_order']}. spikefuse: {recipe['spikefuse']}; SpikingJelly: its {recipe['spikingjelly_mode']} "
               f"step; snnTorch: {recipe['snntorch']}; Norse: {recipe['norse']}. Wall time: {recipe['wall_time']}"
               + ("; each library's run in a fresh process (the data loaded and the CUDA and Triton start-up "
                  "paid before its clock)" if recipe.get("isolation") == "process" else "")
               + ". "
               f"Target: the lowest final test accuracy among the ranked libraries minus {recipe['margin_points']:g} "
               "point(s); time to target: the wall time at the end of the first epoch that reached it.\n")
    cache = payload.get("triton_cache")
    if cache and cache.get("speculative_compiles") and payload["device_type"] == "cuda":
        out.append("spikefuse's speculative compiles were on (SPIKEFUSE_SPECULATIVE_COMPILE=1).\n")
    out.append(f"Equations: {payload['equations']}\n")
    out.append(f"Cross-check: {payload['tolerances']['check']}; passed where at most "
               f"{payload['tolerances']['spike_mismatch']:g} of each layer's spikes differ and every gradient is "
               f"within {payload['tolerances']['grad_rel_err']:g} relative error. A library that fails it is "
               "not ranked.\n")
    if payload.get("medians"):
        out.append(_medians_text(payload["medians"]))
    header = ["library", "ranked", "time to target s", "x spikefuse", "final test", "best test", "epochs",
              "stopped by", "wall s", "first epoch s", "peak MiB", "cross-check"]
    for task in payload["tasks"]:
        s = task["summary"]
        seed = f", seed {task['seed']}" if payload.get("medians") else ""
        out.append(f"## {task['task']}{seed}\n\n{task['network']}; {task['train_samples']} training / {task['test_samples']} "
                   f"test samples, T={task['T']}, B={task['B']}; target "
                   + (f"{s['target']:.2%}" if s["target"] is not None else "none") + "\n")
        if task.get("triton_cache") and payload["device_type"] == "cuda":
            out.append(_cache_text(task["triton_cache"]))
        rows = []
        for r in task["runs"]:
            entry, check = s["libraries"][r["run"]], task["cross_check"].get(r["run"])
            if not r["epochs"]:
                rows.append([r["run"], f"no ({r['status']}: {entry.get('why_not_ranked')})"] + [None] * 10)
                continue
            reached = entry.get("time_to_target_s")
            rows.append([r["run"], "yes" if entry["ranked"] else f"no ({entry.get('why_not_ranked')})",
                         "-" if s["target"] is None else f"{reached:.2f}" if reached is not None else "not reached",
                         entry.get("x_spikefuse"), _pct(entry.get("final_test_acc")), _pct(entry.get("best_test_acc")),
                         entry.get("epochs"), entry.get("stopped_by"), entry.get("wall_s"), entry.get("first_epoch_s"),
                         entry.get("peak_mib"),
                         "reference" if r["run"] == "spikefuse" else _check_text(check)])
        out.append(table(header, rows))
        out.append("\n" + "\n".join(f"- {r['run']}: {r.get('implementation', '-')}" for r in task["runs"]
                                    if r["status"] == "ran") + "\n")
        if task.get("seconds") is not None:
            out.append(_harness_text(task))
        for r in (r for r in task["runs"] if r["epochs"]):
            out.append(f"\n{r['run']} per epoch (set-up {r['setup_s']:.2f} s)\n")
            out.append(table(["epoch", "wall s", "epoch s", "train loss", "test", "peak MiB"],
                             [[e["epoch"], e["wall_s"], e["epoch_time_s"], e["train_loss"], _pct(e["test_acc"]),
                               e["peak_mib"]] for e in r["epochs"]]))
    if payload["skipped_libraries"]:
        out.append("\nNot run:\n\n" + "\n".join(f"- {n}: {why}" for n, why in payload["skipped_libraries"].items()) + "\n")
    return "\n".join(out)


def _medians_text(medians_) -> str:
    """The headline under --seeds: per task, each library's median time to target and its times."""
    out = ["## Median time to target over the seeds\n\nEach seed is a whole run of the task (its own initial "
           "weights, data order and target); per library the median of its times to target (a seed where it did "
           "not reach the target counts as never).\n"]
    for task, m in medians_.items():
        seeds = ", ".join(f"{s} ({t:.2%})" if t is not None else f"{s} (none)" for s, t in zip(m["seeds"], m["targets"]))
        rows = [[n, "not reached" if e["median_s"] is None else f"{e['median_s']:.2f}", e["x_spikefuse"],
                 ", ".join("-" if t is None else f"{t:.2f}" for t in e["times_s"])]
                for n, e in sorted(m["libraries"].items(), key=lambda kv: (kv[1]["median_s"] is None,
                                                                            kv[1]["median_s"] or 0))]
        out.append(f"### {task}\n\nSeeds (targets): {seeds}\n")
        out.append(table(["library", "median s", "x spikefuse", "per seed s"], rows))
    return "\n".join(out) + "\n"


def _harness_text(task) -> str:
    """Where the task's wall time went outside the libraries' clocks: each run's process
    (Python and torch started, data, imports, device warm-up, the run, exit) and each cross-check."""
    parts = []
    for r in task["runs"]:
        p = r.get("process")
        if p:
            parts.append(f"{r['run']} {p.get('total_s', 0):.1f} s (start {p['start_s']:.1f}, data {p['data_s']:.1f}, "
                         f"imports {p['imports_s']:.1f}, warm-up {p['warm_device_s']:.1f}, run {p['run_s']:.1f})")
    checks = [f"{n} {c['seconds']:.1f} s" for n, c in task["cross_check"].items() if "seconds" in c]
    return (f"\nHarness: the task took {task['seconds']:.1f} s"
            + (f"; processes: {'; '.join(parts)}" if parts else "")
            + (f"; cross-checks: {', '.join(checks)}" if checks else "") + ".\n")


def _cache_text(cache) -> str:
    return (f"Triton's kernel cache ({cache['dir']}) held {cache['entries_at_start']} entries as this task began: "
            + ("a cold cache, as on a machine's first run: every Triton kernel (spikefuse's, SpikingJelly's) was "
               "compiled within its library's first epoch" if cache["state"] == "cold" else
               "a warm cache: kernels an earlier run (or task) compiled were loaded from it") + ".\n")


def _check_text(check) -> str:
    if check is None:
        return "-"
    if "error" in check:
        return f"FAILED to run: {check['error']}"
    return (("pass" if check["passed"] else "FAILED") + f", spikes {min(check['spike_agreement']):.6f} equal, "
            f"grad err {max(check['grad_rel_err'].values()):.1e}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    configure(p)
    raise SystemExit(run(p.parse_args()))
