"""Produces benchmarks/results/sparse-accuracy-*-<gpu>.json (its OUT argument) and .txt (stdout); on a GPU.

Issue 16's accuracy acceptance: the IPU-study network (IPUNet, 700 or 30 inputs -> 1472 ->
1470 LIF at width 1, time-mean readout) trained dense (torch Adam) and sparse (sparse=True:
secondary gradient threshold 0.9 x threshold, sparse backward, spikefuse.optim.LazyAdam) for
the same number of epochs, from the same initial weights and data order, on shd-synthetic and
randman made hard enough that the dense test accuracy stays below 95%. One line per run, one
verdict line per data set and init:

    VERDICT shd-synthetic (init sigma_u=1): dense 92.27% (below 95%: yes), sparse 92.05% (-0.22 points; ...) after 30 epochs; sparse within 1 point of dense: yes

"Within 1 point" reads the acceptance's "reach the dense path's accuracy within 1 point": the
sparse run's final-epoch test accuracy is at least the dense run's minus 1 point (--margin).
The mean of the last 3 epochs is printed beside it: with 4000 test samples one accuracy moves
by about 0.3-0.5 point from epoch to epoch, and by about 1 point from seed to seed, so
`--seed 0,1,2` runs each seed in turn and adds a VERDICT-MEAN line on their mean.

Init: both runs start from IPUNet.fluctuation_init_(a training batch, sigma_u): each hidden
layer's weights rescaled so that its free membrane potential has std sigma_u x threshold
(Rossbroich, Gygax & Zenke 2022). The study's own init leaves randman's second hidden layer
silent: no potential reaches 0.9, so the sparse network gets no gradient at all and stays at
chance (NoGradientWarning). --sigma-u takes a list: one dense/sparse pair and verdict each;
the default "1,2" runs stork's value 1 and the denser 2, with which the sparse path trails
less; 0 keeps the study's init (randman's sparse run then shows the failure).

Harder tasks (the defaults; every knob is an option):
  shd-synthetic: 60% background events (noise 0.6), 400 events per second, 1000 training and
      4000 test samples, T = 100 (the named set: 10% noise, 3000 events, 8156/2264 samples;
      dense reaches 99.9% in a few epochs).
  randman: 20 units, 20 classes, 3-D manifolds, 250 samples per class of which 80% are held
      out: 1000 training and 4000 test samples, T = 50 (the named set: 100 units, 10 classes,
      1-D manifolds; dense reaches 100% in 3 epochs).
  30 epochs at lr 3e-3, batch 64: both tasks are then generalisation-limited (training accuracy
  reaches 100%, test accuracy has plateaued). Measured on a CPU at width 1 (sigma_u 1, seed 0):
  dense plateaus at 93.5-93.9% on shd-synthetic (from epoch 6) and 85.3-85.6% on randman (from
  epoch 20); randman with 30 units reaches 95.05% at width 1 (90.7% at width 0.25).

Variants (--variants, comma-separated, or "all"; each one more run per data set, at the first
sigma_u only):
  sparse-step   sparse path with the study's per-step cut (grad_scope "step"; "sparse" uses
                IPUNet's default, "batch": whole surrogates of the neurons that reached the cut)
  sparse-sequence  sparse path, the cut decided per neuron and sample (grad_scope "sequence")
  sparse-adam   sparse path with torch Adam instead of LazyAdam (the optimizer's share)
  theta0.5      sparse path, grad_threshold 0.5 x threshold
  theta-inf     sparse path with grad_threshold -inf (cuts nothing: dense gradients through
                the sparse layers; with LazyAdam it must equal the dense run)
  study-init    the dense run from the study's init (what the fluctuation init changes)

    python3 benchmarks/sparse_accuracy.py OUT.json [--epochs 30] [--width 1] [--sigma-u 1,2]
        [--variants all] [--datasets shd-synthetic,randman] [--shd-* ...] [--rm-* ...]

Cost at the defaults: 8 runs (2 data sets x 2 inits x dense/sparse), each 30 epochs x (1000
trained + 4000 evaluated samples); --variants all adds 14 more.
"""
from __future__ import annotations

import argparse
import json
import time
import warnings

import torch

from spikefuse.data import embedded, load
from spikefuse.data.dataset import DenseSpikeDataset, Splits
from spikefuse.data.synthetic import SyntheticSHD
from spikefuse.models.ipu import FLUCTUATION_SIGMA_U, IPUNet
from spikefuse.nn.sparse_linear import NoGradientWarning
from spikefuse.optim import LazyAdam
from spikefuse.train.loop import fit

DATASETS = ("shd-synthetic", "randman")
# name: (sparse, grad_threshold, optimizer, fluctuation init, grad_scope; None: IPUNet's default, "batch")
RUNS = {
    "dense": (False, None, "Adam", True, None),
    "sparse": (True, 0.9, "LazyAdam", True, None),
    "sparse-step": (True, 0.9, "LazyAdam", True, "step"),
    "sparse-sequence": (True, 0.9, "LazyAdam", True, "sequence"),
    "sparse-adam": (True, 0.9, "Adam", True, None),
    "theta0.5": (True, 0.5, "LazyAdam", True, None),
    "theta-inf": (True, float("-inf"), "LazyAdam", True, None),
    "study-init": (False, None, "Adam", False, None),
}
LAST = 3  # epochs averaged beside the final one


def options(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("out", help="JSON file: settings, every run's per-epoch metrics, verdicts")
    p.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated, from " + ", ".join(DATASETS))
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--width", type=float, default=1.0, help="IPUNet width (1: 1472 + 1470 hidden)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", default="0", help="weights, data order and the init batch; comma-separated "
                   "seeds run in turn, with a verdict on their mean")
    p.add_argument("--sigma-u", default=f"{FLUCTUATION_SIGMA_U:g},2",
                   help="fluctuation init targets (free potential std / threshold), comma-separated: a dense "
                        "and a sparse run and a verdict for each; 0 keeps the study's init")
    p.add_argument("--init-batch", type=int, default=256, help="training samples the init measures")
    p.add_argument("--variants", default="", help="extra runs: " + ", ".join(list(RUNS)[2:]) + ", or all")
    p.add_argument("--margin", type=float, default=1.0, help="points the sparse run may trail the dense one")
    g = p.add_argument_group("shd-synthetic (spikefuse.data.synthetic.SyntheticSHD)")
    g.add_argument("--shd-noise", type=float, default=0.6, help="share of background events")
    g.add_argument("--shd-events", type=int, default=400, help="mean events per second")
    g.add_argument("--shd-train", type=int, default=1000, help="training samples")
    g.add_argument("--shd-test", type=int, default=4000, help="test samples")
    g.add_argument("--shd-steps", type=int, default=100, help="time steps (1 s windows)")
    g = p.add_argument_group("randman (spikefuse.data.embedded.randman)")
    g.add_argument("--rm-units", type=int, default=20)
    g.add_argument("--rm-classes", type=int, default=20)
    g.add_argument("--rm-dim", type=int, default=3, help="manifold dimension")
    g.add_argument("--rm-alpha", type=float, default=2.0, help="smoothness")
    g.add_argument("--rm-samples", type=int, default=250, help="samples per class (train + test)")
    g.add_argument("--rm-test-fraction", type=float, default=0.8)
    g.add_argument("--rm-steps", type=int, default=50)
    a = p.parse_args(argv)
    variants = [v for v in a.variants.split(",") if v]
    if variants == ["all"]:
        variants = list(RUNS)[2:]
    bad = [v for v in variants if v not in list(RUNS)[2:]]
    if bad:
        p.error(f"--variants: unknown {bad}; expected some of {list(RUNS)[2:]} or all")
    a.runs = ["dense", "sparse", *variants]
    try:
        a.sigmas = [float(v) for v in a.sigma_u.split(",") if v]
    except ValueError:
        p.error(f"--sigma-u: expected comma-separated numbers, got {a.sigma_u!r}")
    if not a.sigmas or any(not v >= 0 for v in a.sigmas):
        p.error(f"--sigma-u: expected numbers >= 0, got {a.sigma_u!r}")
    try:
        a.seeds = [int(v) for v in a.seed.split(",") if v]
    except ValueError:
        p.error(f"--seed: expected comma-separated integers, got {a.seed!r}")
    if not a.seeds:
        p.error("--seed: expected at least one seed")
    a.datasets = [d for d in a.datasets.split(",") if d]
    if not a.datasets or any(d not in DATASETS for d in a.datasets):
        p.error(f"--datasets: expected some of {list(DATASETS)}")
    return a


def make_splits(name: str, a, device) -> tuple[Splits, dict]:
    if name == "shd-synthetic":
        settings = dict(noise=a.shd_noise, mean_events=a.shd_events, train=a.shd_train, test=a.shd_test,
                        time_steps=a.shd_steps)
        kw = dict(seed=a.seed, noise=a.shd_noise, mean_events=a.shd_events)
        pair = SyntheticSHD("train", samples=a.shd_train, **kw), SyntheticSHD("test", samples=a.shd_test, **kw)
        return load(pair, time_steps=a.shd_steps, framing="window", device=device), settings
    settings = dict(n_units=a.rm_units, n_classes=a.rm_classes, manifold_dim=a.rm_dim, alpha=a.rm_alpha,
                    samples_per_class=a.rm_samples, test_fraction=a.rm_test_fraction, time_steps=a.rm_steps)
    x_tr, y_tr, x_te, y_te = (t.to(device) for t in embedded.randman(seed=a.seed, **settings))
    train, test = DenseSpikeDataset(x_tr, y_tr), DenseSpikeDataset(x_te, y_te)
    settings.update(train=len(train), test=len(test))
    return Splits("randman", train, test, a.rm_classes, train.input_shape, a.rm_steps), settings


def train(run: str, splits: Splits, a, sigma_u: float, device) -> dict:
    sparse, theta, optimizer, fluctuation, scope = RUNS[run]
    torch.manual_seed(a.seed)
    model = IPUNet(splits.input_shape, splits.num_classes, width=a.width, sparse=sparse,
                   **({} if theta is None else {"grad_threshold": theta}),
                   **({} if scope is None else {"grad_scope": scope})).to(device)
    scales = None
    if fluctuation and sigma_u > 0:
        x, _ = next(iter(splits.train.batches(a.init_batch, shuffle=True,
                                              generator=torch.Generator().manual_seed(a.seed))))
        scales = model.fluctuation_init_(x.to(device), sigma_u)
    opt = (LazyAdam if optimizer == "LazyAdam" else torch.optim.Adam)(model.parameters(), lr=a.lr)
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", NoGradientWarning)
        history = fit(model, splits, opt, epochs=a.epochs, batch_size=a.batch_size, device=device,
                      progress=False, seed=a.seed)
    wall = time.perf_counter() - t0
    acc = [h["test_acc"] for h in history]
    # the share of each sparse layer's outputs that carry gradient, on one training batch of the
    # trained network (no update): what the sparse backward's speed depends on
    x, y = next(iter(splits.train.batches(a.batch_size, shuffle=False)))
    for m in model.modules():
        if hasattr(m, "carrying_share"):
            m.carrying_share()  # reset
    model.train()
    torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
    carrying = [m.carrying_share() for m in model.modules() if hasattr(m, "carrying_share")]
    model.zero_grad(set_to_none=True)
    return {"dataset": splits.name, "seed": a.seed, "run": run, "sparse": sparse, "theta_grad": theta, "optimizer": optimizer,
            "grad_scope": (scope or "batch") if sparse else None,
            "init": f"fluctuation sigma_u={sigma_u:g}" if scales is not None else "study", "init_scales": scales,
            "wall_s": wall, "test_acc": acc, "final": acc[-1], "last_mean": sum(acc[-LAST:]) / len(acc[-LAST:]),
            "train_acc": [h["train_acc"] for h in history], "train_loss": [h["train_loss"] for h in history],
            "train_rate": [h.get("train_rate") for h in history],
            "samples_per_s": [h.get("samples_per_s") for h in history],
            "no_gradient_warnings": sum(issubclass(w.category, NoGradientWarning) for w in caught),
            "carrying_share": carrying}


def verdict(name: str, sigma_u: float, runs: dict, margin: float) -> dict:
    dense, sparse = runs["dense"], runs["sparse"]
    diff = 100 * (sparse["final"] - dense["final"])
    ok = diff >= -margin
    below = dense["final"] < 0.95
    line = (f"VERDICT {name} (init sigma_u={sigma_u:g}): dense {100 * dense['final']:.2f}% (below 95%: {'yes' if below else 'no'}), "
            f"sparse {100 * sparse['final']:.2f}% ({diff:+.2f} points; last-{LAST} means "
            f"{100 * dense['last_mean']:.2f}% / {100 * sparse['last_mean']:.2f}%) after {len(dense['test_acc'])} "
            f"epochs; sparse within {margin:g} point of dense: {'yes' if ok else 'no'}")
    return {"dataset": name, "sigma_u": sigma_u, "dense": dense["final"], "sparse": sparse["final"], "diff_points": diff,
            "dense_below_95": below, "within": ok, "line": line}


def main(argv=None):
    a = options(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True  # both paths alike (the sparse kernels follow this flag)
    record = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
              "settings": {k: v for k, v in vars(a).items() if k != "out"}, "data": {}, "runs": [], "verdicts": []}
    start = time.perf_counter()
    for name in a.datasets:
        for seed in a.seeds:
            a.seed = seed  # what make_splits and train read
            run_dataset(name, a, device, record)
        if len(a.seeds) > 1:
            for sigma_u in a.sigmas:
                v = mean_verdict(name, sigma_u, [v for v in record["verdicts"] if v["dataset"] == name
                                                 and v["sigma_u"] == sigma_u], a.margin)
                record["mean_verdicts"] = record.get("mean_verdicts", []) + [v]
                print(v["line"], flush=True)
    record["wall_s"] = time.perf_counter() - start
    json.dump(record, open(a.out, "w"), indent=1)
    print(f"total {record['wall_s']:.1f} s on {record['device']}", flush=True)


def mean_verdict(name: str, sigma_u: float, verdicts: list, margin: float) -> dict:
    """The verdict on the seeds' mean final accuracies (one seed moves them by about a point)."""
    dense = sum(v["dense"] for v in verdicts) / len(verdicts)
    sparse = sum(v["sparse"] for v in verdicts) / len(verdicts)
    diff = 100 * (sparse - dense)
    ok = diff >= -margin
    line = (f"VERDICT-MEAN {name} (init sigma_u={sigma_u:g}, seeds {[v['seed'] for v in verdicts]}): dense "
            f"{100 * dense:.2f}%, sparse {100 * sparse:.2f}% ({diff:+.2f} points; per seed "
            f"{[round(v['diff_points'], 2) for v in verdicts]}); within {margin:g} point: {'yes' if ok else 'no'}")
    return {"dataset": name, "sigma_u": sigma_u, "dense": dense, "sparse": sparse, "diff_points": diff,
            "within": ok, "line": line}


def run_dataset(name: str, a, device, record: dict) -> None:
    """Every run of one data set at one seed (a.seed), a verdict per sigma_u."""
    splits, settings = make_splits(name, a, device)
    record["data"][name] = settings
    print(f"{name} (seed {a.seed}): {settings}; {len(splits.train)} train / {len(splits.test)} test samples, "
          f"width {a.width}, {a.epochs} epochs", flush=True)
    for k, sigma_u in enumerate(a.sigmas):
        runs = {}
        for run in a.runs if k == 0 else a.runs[:2]:  # the variants at the first sigma_u only
            r = runs[run] = train(run, splits, a, sigma_u, device)
            r["sigma_u"] = sigma_u
            record["runs"].append(r)
            extra = f", {r['no_gradient_warnings']} NoGradientWarnings" if r["no_gradient_warnings"] else ""
            if r["carrying_share"]:
                extra += f", carrying share {[None if c is None else round(c, 3) for c in r['carrying_share']]}"
            print(f"  {run:11s} theta={r['theta_grad']} scope={r['grad_scope']} {r['optimizer']:8s} init={r['init']}: test acc "
                  f"{[round(100 * x, 2) for x in r['test_acc']]}, {r['wall_s']:.1f} s{extra}", flush=True)
            json.dump(record, open(a.out, "w"), indent=1)
        v = verdict(name, sigma_u, runs, a.margin)
        v["seed"] = a.seed
        record["verdicts"].append(v)
        print(v["line"], flush=True)
        json.dump(record, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
