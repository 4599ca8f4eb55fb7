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
    model = build_model("mlp", splits.input_shape, splits.num_classes, hidden=(64, 64)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    assert prepare_optimizer(optimizer) is None  # on CUDA parameters: else it refuses (and says why)
    trainer = Trainer(model, splits, optimizer, epochs=epochs, batch_size=64, device="cuda",
                      capture=variant != "eager", progress=False)
    if variant.startswith("side-stream-only"):
        trainer.step.warmup = 10**9  # every step a warm-up: eager on the side stream
    step = trainer.step
    if variant == "warm-up-on-main":
        step._warm_up = lambda inputs: step.step_fn(*inputs)
    losses = []

    def recording(x, y):
        if variant.endswith("cloned-inputs"):  # the batch copied on the main stream first
            x, y = x.clone(), y.clone()
        losses.append(step(x, y).detach().clone())
    trainer.step = recording
    trainer.fit()
    return torch.stack(losses).cpu(), [p.detach().clone() for p in model.parameters()], step


def direct(on_side_stream, steps=10):
    """The trainer's model and optimizer on fixed random batches, no data pipeline, no trainer."""
    torch.manual_seed(0)
    model = build_model("mlp", (64,), 10, hidden=(64, 64)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    prepare_optimizer(optimizer)
    g = torch.Generator(device="cuda").manual_seed(1)
    batches = [((torch.rand(8, 64, 64, device="cuda", generator=g) < 0.3).float(),
                torch.randint(0, 10, (64,), device="cuda", generator=g)) for _ in range(steps)]
    side = torch.cuda.Stream()
    losses = []
    for x, y in batches:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side) if on_side_stream else torch.cuda.stream(torch.cuda.current_stream()):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        torch.cuda.current_stream().wait_stream(side)
        losses.append(loss.detach().clone())
    return torch.stack(losses).cpu()


def main():
    a, b = direct(False), direct(True)
    print("no trainer, no data pipeline: main vs side stream equal:", torch.equal(a, b),
          "first differing step", (a != b).nonzero().flatten().tolist()[:1])
    torch.use_deterministic_algorithms(True, warn_only=True)
    reference, params, _ = run("eager")
    again, params2, _ = run("eager")
    print("eager vs eager: equal losses", torch.equal(reference, again))
    for variant in ("captured", "side-stream-only", "side-stream-only-cloned-inputs", "warm-up-on-main",
                    "captured-cloned-inputs"):
        losses, p, step = run(variant)
        differ = (losses != reference).nonzero().flatten().tolist()
        print(f"{variant}: graphs {step.captured}, first differing step {differ[:1]} of {len(losses)}, "
              f"max |diff| {(losses - reference).abs().max().item():.3g}, "
              f"params equal {all(torch.equal(a, b) for a, b in zip(p, params))}")


if __name__ == "__main__":
    main()
