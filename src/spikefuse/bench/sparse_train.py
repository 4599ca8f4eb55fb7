"""Sparse against dense *training runs*: samples/s through training and wall time to accuracy
(`spikefuse bench sparse --train`; issue 32).

Per case (task, network, width, batch) and seed, one run after the other in one process,
every run from the same initial weights (the fluctuation-driven init `spikefuse train
--sparse` applies, measured once on the same training samples and loaded into each run),
the same data order and the same rate regulariser (--max-rate, --rate-weight), each through
spikefuse.train.Trainer as `fit` runs it (captured on CUDA, fp32 with TF32 matmuls):
- dense:           IPUNet(sparse=False), torch Adam (fused on CUDA);
- sparse:          IPUNet(sparse=True): gradient only through potentials that reached 0.9 x
                   threshold, each layer's backward chosen by update_dispatch between
                   epochs, LazyAdam;
- dense-lazyadam:  the dense network with LazyAdam: the optimizer's own share of any
                   accuracy difference;
- dense-free:      the dense run without the regulariser (when one is given): the
                   accuracy the others are held to.
Per epoch: wall time (training, evaluation, dispatch, re-capture), training samples/s, each
hidden layer's firing rate, each sparse layer's carrying share and chosen backward, train
and test accuracy. The target of a seed is the dense run's best test accuracy minus
--margin points; each run's time to it counts its set-up (model, init, optimizer) and every
epoch up to the first that reached it. The first epoch includes Triton's compilation and
the CUDA-graph capture: run with a fresh TRITON_CACHE_DIR for a cold-cache figure.

    spikefuse bench sparse --train --out benchmarks/results
    spikefuse bench sparse --train --cases shd-synthetic-hard:ff:4:8 --epochs 20 --seeds 0,1,2 --max-rate 0.05 --rate-log 0.05
    spikefuse bench sparse --train --quick --out /tmp/bench   # tiny, on the CPU too: a smoke test
"""
from __future__ import annotations

import io
import math
import statistics
import time

import torch

from ..data import embedded, load
from ..data.dataset import DenseSpikeDataset, Splits
from ..data.synthetic import SyntheticSHD
from ..errors import UsageError
from ..models.ipu import HIDDEN, IPUNet
from ..optim import LazyAdam
from ..train.activity import check_rate_options
from ..train.config import MAX_COUNT
from ..train.loop import Trainer
from .atomic import atomic_write
from . import options
from .report import environment, table, write_results

RUNS = ("dense", "sparse", "dense-lazyadam", "dense-free")
NETS = ("ff", "recurrent")
INIT_SAMPLES = 256  # as `spikefuse train --sparse`


# ---- tasks: the named sets, and the harder variants of benchmarks/sparse_accuracy.py ----

def _shd_hard(device, quick):
    """shd-synthetic with 60% background events at 400 events/s, 1000 training and 4000 test
    samples, T = 100: dense training then stays generalisation-limited below 95%."""
    train, test = (32, 16) if quick else (1000, 4000)
    kw = dict(seed=0, noise=0.6, mean_events=400)
    pair = SyntheticSHD("train", samples=train, **kw), SyntheticSHD("test", samples=test, **kw)
    return load(pair, time_steps=100, framing="window", device=device, progress=False)


def _randman_hard(device, quick):
    """randman with 20 units, 20 classes on 3-D manifolds, 1000 training and 4000 test samples."""
    steps, per_class = 50, (5 if quick else 250)
    x_tr, y_tr, x_te, y_te = (t.to(device) for t in embedded.randman(
        time_steps=steps, n_classes=20, n_units=20, samples_per_class=per_class, manifold_dim=3,
        alpha=2.0, test_fraction=0.8, seed=0))
    train, test = DenseSpikeDataset(x_tr, y_tr), DenseSpikeDataset(x_te, y_te)
    return Splits("randman-hard", train, test, 20, train.input_shape, steps)


def _named(name):
    return lambda device, quick: load(name, device=device, progress=False)


TASKS = {"shd-synthetic-hard": _shd_hard, "randman-hard": _randman_hard, "shd-synthetic": _named("shd-synthetic"),
         "randman": _named("randman"), "nmnist-synthetic": _named("nmnist-synthetic")}


def default_cases():
    """The acceptance's cases: width 4 at batches 8 and 64, width 1 at batch 8, the
    recurrent width 4 at batch 8, on both hard tasks."""
    shapes = [("ff", 4.0, 8), ("ff", 4.0, 64), ("ff", 1.0, 8), ("recurrent", 4.0, 8)]
    return [(task, *shape) for task in ("shd-synthetic-hard", "randman-hard") for shape in shapes]


def parse_cases(text):
    """'default' or task:net:width:batch,... (net: ff or recurrent)."""
    if text == "default":
        return default_cases()
    cases = []
    for item in (i.strip() for i in text.split(",") if i.strip()):
        try:
            task, net, width, batch = item.split(":")
            case = (task, net, float(width), int(batch))
        except ValueError:
            raise UsageError(f"--cases: expected task:net:width:batch items, got {item!r}") from None
        if task not in TASKS or net not in NETS or not 0 < case[2] < math.inf or not 1 <= case[3] <= MAX_COUNT:
            raise UsageError(f"--cases {item!r}: task one of {list(TASKS)}, net one of {list(NETS)}, "
                             f"width finite and > 0, batch from 1 to {MAX_COUNT}")
        options.width(f"--cases {item!r}", case[2], max(HIDDEN))
        cases.append(case)
    if not cases:
        raise UsageError("--cases: no case given")
    return cases


def parse_list(text, kind, name, allowed=None):
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or (allowed is not None and set(values) - set(allowed)):
        raise UsageError(f"--{name} {text!r}: expected a comma-separated list"
                         + (f" of {', '.join(allowed)}" if allowed else f" of {kind.__name__}s"))
    return values


# ---- one training run ----

def initial_state(splits, net, width, seed, device):
    """The weights every run of a case and seed starts from: IPUNet at `seed`, then the
    fluctuation-driven init on the first INIT_SAMPLES training samples."""
    torch.manual_seed(seed)
    model = IPUNet(splits.input_shape, splits.num_classes, width=width, recurrent=net == "recurrent").to(device)
    x, _ = next(iter(splits.train.batches(min(INIT_SAMPLES, len(splits.train)), shuffle=False)))
    scales = model.fluctuation_init_(x.to(device))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, scales


def train_run(run, splits, case, seed, state, args, device) -> dict:
    task, net, width, batch = case
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    cut = {"grad_threshold": args.grad_threshold} if run == "sparse" else {}  # IPUNet's threshold is 1
    model = IPUNet(splits.input_shape, splits.num_classes, width=width, sparse=run == "sparse",
                   recurrent=net == "recurrent", **cut).to(device)
    model.load_state_dict(state)
    if run in ("sparse", "dense-lazyadam"):
        optimizer = LazyAdam(model.parameters(), lr=args.lr)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, fused=device.type == "cuda" or None)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    regularised = _regularised(args) and run != "dense-free"
    trainer = Trainer(model, splits, optimizer, epochs=args.epochs, batch_size=batch, scheduler=scheduler,
                      device=device, seed=seed, progress=False, max_rate=args.max_rate if regularised else None,
                      rate_weight=args.rate_weight, rate_l1=args.rate_l1 if regularised else 0.0,
                      rate_log=args.rate_log if regularised else 0.0)
    setup = time.perf_counter() - start
    history = trainer.fit()
    epochs = [{k: h.get(k) for k in ("epoch", "epoch_time_s", "train_time_s", "samples_per_s", "train_acc",
                                     "test_acc", "train_loss", "train_firing_rates", "rate_penalty",
                                     "sparse_layers")} for h in history]
    return {"task": task, "net": net, "width": width, "B": batch, "seed": seed, "run": run,
            "regularised": regularised, "setup_s": setup, "epochs": epochs}


def check_args(args) -> None:
    """The numeric options, named as given (UsageError), before the device is looked at: a NaN
    --lr, --max-rate or --margin, --epochs 0 or 2**70 were taken into the runs."""
    options.count("--epochs", args.epochs)
    options.rate("--lr", args.lr)
    try:
        check_rate_options(0.0 if args.max_rate is None else args.max_rate, args.rate_weight, args.rate_l1,
                           args.rate_log)
    except ValueError as e:  # the words of `spikefuse train`'s --max-rate, --rate-weight, --rate-l1, --rate-log
        raise UsageError("--" + str(e).replace("_", "-", 1)) from None
    options.number("--grad-threshold", args.grad_threshold)
    options.number("--margin", args.margin, low=0, high=100)


def _regularised(args) -> bool:
    return args.max_rate is not None or args.rate_l1 > 0 or args.rate_log > 0


def steady_rate(row) -> float:
    """Median training samples/s over the epochs after the first."""
    later = [e["samples_per_s"] for e in row["epochs"][1:]] or [row["epochs"][0]["samples_per_s"]]
    return statistics.median(later)


def time_to(row, target) -> float | None:
    """Wall time from the run's start to the end of the first epoch whose test accuracy
    reached `target` (None: never)."""
    elapsed = row["setup_s"]
    for e in row["epochs"]:
        elapsed += e["epoch_time_s"]
        if e["test_acc"] >= target:
            return elapsed
    return None


def summarise(rows, margin):
    """Per case and seed: the target, and per run its steady samples/s, its first epoch's
    time over its second, its time to target, the most any hidden layer fired, and ratios
    against dense."""
    out = []
    keys = sorted({(r["task"], r["net"], r["width"], r["B"], r["seed"]) for r in rows}, key=str)
    for key in keys:
        runs = {r["run"]: r for r in rows if (r["task"], r["net"], r["width"], r["B"], r["seed"]) == key}
        dense = runs.get("dense")
        if dense is None:
            continue
        target = max(e["test_acc"] for e in dense["epochs"]) - margin / 100
        base_rate, base_time = steady_rate(dense), time_to(dense, target)
        for name, r in runs.items():
            rates = [max(e["train_firing_rates"].values(), default=0.0) for e in r["epochs"]]
            first = r["epochs"][0]["train_time_s"]
            second = r["epochs"][1]["train_time_s"] if len(r["epochs"]) > 1 else None
            t = time_to(r, target)
            out.append({"task": key[0], "net": key[1], "width": key[2], "B": key[3], "seed": key[4], "run": name,
                        "target": target, "samples_per_s": steady_rate(r),
                        "speedup": steady_rate(r) / base_rate,
                        "first_over_second": first / second if second else None,
                        "first_over_dense_first": first / dense["epochs"][0]["train_time_s"],
                        "time_to_target_s": t,
                        "time_speedup": base_time / t if t and base_time else None,
                        "final_test_acc": r["epochs"][-1]["test_acc"],
                        "best_test_acc": max(e["test_acc"] for e in r["epochs"]),
                        "max_hidden_rate": max(rates)})
    return out


# ---- the benchmark ----

def run(args) -> int:
    quick = args.quick or args.smoke
    # quick: one feed-forward case (under Triton's interpreter a recurrent one launches per step)
    cases = [("shd-synthetic-hard", "ff", 1 / 64, 8)] if quick else parse_cases(args.cases)
    runs = parse_list(args.runs, str, "runs", RUNS)
    seeds = [options.seed("--seeds", s) for s in parse_list(args.seeds, int, "seeds")]
    check_args(args)
    args.epochs = 2 if quick else args.epochs
    if not _regularised(args):
        runs = [r for r in runs if r != "dense-free"]  # without a regulariser it is the dense run
    if "dense" not in runs:
        raise UsageError("--runs: the dense run is the reference of every ratio and target; include it")
    cuda = torch.cuda.is_available()
    if not cuda and not quick:
        raise UsageError("spikefuse bench sparse --train needs a CUDA device (or --quick, tiny sizes on the CPU)")
    device = torch.device("cuda" if cuda else "cpu")
    rows, inits = [], []

    def save():  # after every run: a benchmark cut short keeps what it measured
        payload = {"benchmark": "sparse-train", "environment": environment(), "quick": args.quick,
                   "smoke": args.smoke and not args.quick,
                   "recipe": {"epochs": args.epochs, "lr": args.lr, "schedule": "cosine", "max_rate": args.max_rate,
                              "rate_weight": args.rate_weight, "rate_l1": args.rate_l1,
                              "rate_log": args.rate_log,
                              "sparse_grad_threshold": args.grad_threshold, "margin_points": args.margin,
                              "precision": "fp32 (TF32 matmuls)", "captured": cuda,
                              "init": f"fluctuation-driven, {INIT_SAMPLES} training samples"},
                   "inits": inits, "runs": rows, "summary": summarise(rows, args.margin)}
        name = "sparse-train-smoke" if payload["smoke"] else "sparse-train"
        return write_results(name, payload, markdown(payload), args.out)

    paths = None
    for case in cases:
        splits = TASKS[case[0]](device, quick)
        for seed in seeds:
            state, scales = initial_state(splits, case[1], case[2], seed, device)
            inits.append({"case": list(case), "seed": seed, "scales": scales})
            for name in runs:
                rows.append(train_run(name, splits, case, seed, state, args, device))
                print(line(rows[-1]), flush=True)
                paths = save()
    if args.chart and paths:
        drawn = chart(rows, paths[0].removesuffix(".json") + ".png", quick=args.quick)
        paths = (*paths, drawn) if drawn else paths
    print("wrote", *paths)
    return 0


def line(row) -> str:
    e = row["epochs"]
    return (f"{row['task']} {row['net']} x{row['width']:g} B={row['B']} seed {row['seed']} {row['run']}: "
            f"{statistics.median(x['samples_per_s'] for x in e[1:] or e):.0f} samples/s after epoch 1 "
            f"(epoch 1: {e[0]['samples_per_s']:.0f}), test {e[-1]['test_acc']:.2%} (best "
            f"{max(x['test_acc'] for x in e):.2%}), hidden rates at the end "
            + "/".join(f"{v:.1%}" for v in e[-1]["train_firing_rates"].values()))


def _regulariser_text(recipe) -> str:
    terms = []
    if recipe["max_rate"] is not None:
        terms.append(f"max rate {recipe['max_rate']:g}, weight {recipe['rate_weight']:g}")
    if recipe.get("rate_l1"):
        terms.append(f"L1 on spikes, weight {recipe['rate_l1']:g}")
    if recipe.get("rate_log"):
        terms.append(f"log term on rates, weight {recipe['rate_log']:g}")
    return " + ".join(terms) or "off"


def markdown(payload) -> str:
    env, recipe = payload["environment"], payload["recipe"]
    out = ["# Sparse vs dense training runs (IPU-study networks)\n",
           f"{env['device']}, {env['date']}, versions {env['versions']}\n",
           f"Recipe: {recipe['epochs']} epochs, Adam/LazyAdam lr {recipe['lr']:g} cosine-annealed, "
           f"{recipe['precision']}, {'captured steps' if recipe['captured'] else 'eager'}, init {recipe['init']}; "
           "rate regulariser: " + _regulariser_text(recipe) +
           f"; sparse cut {recipe.get('sparse_grad_threshold', 0.9):g} x threshold" +
           f". Target: the dense run's best test accuracy minus {recipe['margin_points']:g} point(s). "
           "samples/s: median over the epochs after the first (training only); time to target: set-up plus "
           "whole epochs (training, evaluation, dispatch, re-capture).\n"]
    header = ["task", "net", "width", "B", "seed", "run", "samples/s", "x dense", "epoch 1 / epoch 2",
              "epoch 1 / dense's", "time to target s", "x dense (time)", "final test", "max hidden rate"]
    rows = [[s["task"], s["net"], f"{s['width']:g}", s["B"], s["seed"], s["run"], f"{s['samples_per_s']:.0f}",
             f"{s['speedup']:.2f}", _ratio(s["first_over_second"]), _ratio(s["first_over_dense_first"]),
             "never" if s["time_to_target_s"] is None else f"{s['time_to_target_s']:.1f}",
             _ratio(s["time_speedup"]), f"{s['final_test_acc']:.2%}", f"{s['max_hidden_rate']:.1%}"]
            for s in payload["summary"]]
    out.append(table(header, rows))
    out.append("\n## Per epoch\n")
    for r in payload["runs"]:
        out.append(f"\n{r['task']} {r['net']} x{r['width']:g} B={r['B']} seed {r['seed']} {r['run']} "
                   f"(set-up {r['setup_s']:.1f} s)\n")
        out.append(table(["epoch", "time s", "samples/s", "train", "test", "hidden rates", "sparse layers"],
                         [[e["epoch"], f"{e['epoch_time_s']:.2f}", f"{e['samples_per_s']:.0f}",
                           f"{e['train_acc']:.2%}", f"{e['test_acc']:.2%}",
                           " ".join(f"{v:.1%}" for v in e["train_firing_rates"].values()),
                           " ".join(f"{v['backward']}({_share(v['share'])})"
                                    for v in (e.get("sparse_layers") or {}).values())]
                          for e in r["epochs"]]))
    return "\n".join(out) + "\n"


def _ratio(value):
    return "-" if value is None else f"{value:.2f}"


def _share(value):
    return "-" if value is None else f"{value:.0%}"


def chart(rows, path, quick=False, targets=None):
    """Test accuracy against wall time, one panel per case (its first seed), one line per run;
    `targets`: case (task, net, width, B) -> a target accuracy drawn dashed across its panel."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print("no chart (matplotlib is not installed: pip install 'spikefuse[plot]')")
        return None
    cases = list(dict.fromkeys((r["task"], r["net"], r["width"], r["B"]) for r in rows))
    fig = Figure(figsize=(4.2 * len(cases), 3.6), layout="constrained")
    axes = fig.subplots(1, len(cases), squeeze=False)[0]
    for ax, case in zip(axes, cases):
        mine = [r for r in rows if (r["task"], r["net"], r["width"], r["B"]) == case]
        first_seed = mine[0]["seed"]
        for r in (r for r in mine if r["seed"] == first_seed):
            times, elapsed = [], r["setup_s"]
            for e in r["epochs"]:
                elapsed += e["epoch_time_s"]
                times.append(elapsed)
            ax.plot(times, [100 * e["test_acc"] for e in r["epochs"]], marker=".", label=r["run"])
        if (targets or {}).get(case) is not None:
            ax.axhline(100 * targets[case], color="black", linestyle="--", linewidth=1, label="target")
        ax.set_title(f"{case[0]} {case[1]} x{case[2]:g} B={case[3]}", fontsize=9)
        ax.set_xlabel("wall time, s")
        ax.set_ylabel("test accuracy, %")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    if quick:
        fig.suptitle("quick run: not benchmark figures")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    atomic_write(path, buffer.getvalue())
    return path
