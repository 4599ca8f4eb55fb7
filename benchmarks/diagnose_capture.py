"""Where does a captured trainer's loss part from the eager one's? Per-step losses of one
Trainer epoch (digits on the GPU, mlp) under variants, each compared with plain eager steps.

    python benchmarks/diagnose_capture.py
"""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

from spikefuse.data import load  # noqa: E402
from spikefuse.models import build_model  # noqa: E402
from spikefuse.train.capture import prepare_optimizer  # noqa: E402
from spikefuse.train.loop import Trainer  # noqa: E402


def run(variant, epochs=2):
    torch.manual_seed(0)
    splits = load("digits", time_steps=8, device="cuda")
    model = build_model("mlp", splits.input_shape, splits.num_classes, hidden=(64, 64))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    prepare_optimizer(optimizer)
    trainer = Trainer(model, splits, optimizer, epochs=epochs, batch_size=64, device="cuda",
                      capture=variant != "eager", progress=False)
    if variant == "side-stream-only":
        trainer.step.warmup = 10**9  # every step a warm-up: eager on the side stream
    if variant == "warm-up-on-main":
        trainer.step._warm_up = lambda inputs: trainer.step.step_fn(*inputs)
    losses = []
    step = trainer.step

    def recording(x, y):
        losses.append(step(x, y).detach().clone())
    trainer.step = recording
    trainer.fit()
    return torch.stack(losses).cpu(), [p.detach().clone() for p in model.parameters()], step


def main():
    torch.use_deterministic_algorithms(True, warn_only=True)
    reference, params, _ = run("eager")
    again, params2, _ = run("eager")
    print("eager vs eager: equal losses", torch.equal(reference, again))
    for variant in ("captured", "side-stream-only", "warm-up-on-main"):
        losses, p, step = run(variant)
        differ = (losses != reference).nonzero().flatten().tolist()
        print(f"{variant}: graphs {step.captured}, first differing step {differ[:1]} of {len(losses)}, "
              f"max |diff| {(losses - reference).abs().max().item():.3g}, "
              f"params equal {all(torch.equal(a, b) for a, b in zip(p, params))}")


if __name__ == "__main__":
    main()
