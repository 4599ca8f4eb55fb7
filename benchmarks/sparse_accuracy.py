"""Issue 16's accuracy check: the IPU-study SHD network trained dense (Adam) and sparse
(secondary gradient threshold 0.9, sparse backward, LazyAdam; also with torch Adam, and with
thresholds 0.5 and -inf, to tell the cut's effect from the optimizer's) for the same epochs
on shd-synthetic and randman; one line per run, JSON with every epoch.

    python3 benchmarks/sparse_accuracy.py OUT.json [EPOCHS] [WIDTH]
"""
import json
import sys
import time

import torch

from spikefuse.data import load
from spikefuse.models.ipu import IPUNet
from spikefuse.optim import LazyAdam
from spikefuse.train.loop import fit

out = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
width = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.backends.cuda.matmul.allow_tf32 = True
runs = []
for dataset in sys.argv[4].split(",") if len(sys.argv) > 4 else ("shd-synthetic", "randman"):
    splits = load(dataset, device=device)
    shape, classes = splits.input_shape, splits.num_classes
    for mode, theta, lazy in (("dense", None, False), ("sparse", 0.9, True), ("sparse", 0.9, False),
                              ("sparse", 0.5, True), ("sparse", float("-inf"), True)):
        torch.manual_seed(0)
        model = IPUNet(shape, classes, width=width, sparse=mode == "sparse",
                       **({} if theta is None else {"grad_threshold": theta}))
        opt = (LazyAdam if lazy else torch.optim.Adam)(model.parameters(), lr=1e-3)
        t0 = time.perf_counter()
        history = fit(model, splits, opt, epochs=epochs, batch_size=64, device=device, progress=False, seed=0)
        wall = time.perf_counter() - t0
        run = {"dataset": dataset, "mode": mode, "theta_grad": theta, "optimizer": "LazyAdam" if lazy else "Adam",
               "width": width, "epochs": epochs, "wall_s": wall,
               "test_acc": [h["test_acc"] for h in history], "train_loss": [h["train_loss"] for h in history],
               "carrying_share": [m.carrying_share() for m in model.modules() if hasattr(m, "carrying_share")]}
        runs.append(run)
        print(f"{dataset} {mode} theta={theta} {run['optimizer']}: test acc per epoch {[round(a, 4) for a in run['test_acc']]}, {wall:.1f} s", flush=True)
        json.dump({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                   "torch": torch.__version__, "runs": runs}, open(out, "w"), indent=1)
