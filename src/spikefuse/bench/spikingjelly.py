"""SpikingJelly 2.0 as the benchmarks run it: its networks built from its own layers, and
a training step in each of its three execution modes, so every comparison is against its
fastest.

- "eager": forward, loss, backward and optimizer step issued from Python.
- "graph": as its example trainer runs `--execution-mode cuda_graph`
  (spikingjelly.activation_based.examples.common.train_classify): forward, loss and
  backward captured by its `_cuda_graph.StaticCudaGraph` (3 warm-up calls, then one
  replay), the gradients zeroed in place before and the optimizer stepped eagerly after.
- "compiled": as its trainer's `--execution-mode compile`: the model under torch.compile
  (inductor's default mode), the rest of the step eager.

The optimizer is torch's, with its fused CUDA kernel where torch has one (Adam, SGD): one
launch per step instead of a loop of foreach launches, the fastest update a SpikingJelly
user can pick. Its LIF picks its own fastest backend (Triton or CuPy for float32; under
bf16 autocast its PyTorch loop).
"""
from __future__ import annotations

import math

import torch
from torch import nn

MODES = ("eager", "graph", "compiled")
GRAPH_WARMUP = 3  # its trainer's default --cuda-graph-warmup-steps


def lif(decay: float, threshold: float, detach_reset: bool, surrogate_function=None):
    """Its multi-step LIFNode with our LIF's equations: tau = 1 / (1 - decay) and
    decay_input=False give h = decay * v + x; hard reset to 0; its Sigmoid surrogate unless
    `surrogate_function` (one of its surrogate objects) is given (its fused kernels have no
    rectangular one, and its SuperSpike scales by alpha rather than sloping)."""
    from spikingjelly.activation_based import neuron, surrogate

    return neuron.LIFNode(tau=1 / (1 - decay), decay_input=False, v_threshold=threshold, v_reset=0.0,
                          detach_reset=detach_reset, surrogate_function=surrogate_function or surrogate.Sigmoid(),
                          step_mode="m")


def mlp(net: str, width: float) -> nn.Module:
    """The IPU network `net` (spikefuse.models.ipu) from its layers: Linear without bias and
    LIF (decay 0.95, threshold 1, reset detached), then a linear readout averaged over time."""
    from spikingjelly.activation_based import functional, layer

    from ..models.ipu import HIDDEN, NETWORKS
    spec = NETWORKS[net]
    sizes = [math.prod(spec.input_shape), *(max(1, round(h * width)) for h in HIDDEN)]
    layers = [nn.Flatten(2)]
    for a, b in zip(sizes, sizes[1:]):
        layers += [layer.Linear(a, b, bias=False, step_mode="m"), lif(0.95, 1.0, detach_reset=True)]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(*layers)
            self.readout = nn.Linear(sizes[-1], spec.num_classes, bias=False)

        def forward(self, x):
            functional.reset_net(self.body)
            return self.readout(self.body(x)).mean(0)
    return Net()


def cifar(size: str, width: float, num_classes: int = 10, time_steps: int = 10, image: int = 32) -> nn.Module:
    """The CIFAR network of Liang et al. (spikefuse.models.cifar) from its layers: Conv or
    Linear, BatchNorm and LIF per block, the image repeated over the time steps (direct
    encoding), a linear readout of the time-averaged spikes."""
    from spikingjelly.activation_based import functional, layer

    from ..models.cifar import FC, LIANG_LIF, TABLE_I, scaled

    def neuron():
        return lif(LIANG_LIF["decay"], LIANG_LIF["threshold"], detach_reset=False)

    layers, c, hw = [], 3, image
    for channels, stride in TABLE_I[size]:
        out = scaled(channels, width)
        layers += [layer.Conv2d(c, out, 3, stride, 1, bias=False, step_mode="m"),
                   layer.BatchNorm2d(out, step_mode="m"), neuron()]
        c, hw = out, (hw - 1) // stride + 1
    layers.append(layer.Flatten(step_mode="m"))
    sizes = [c * hw * hw, *(scaled(f, width) for f in FC)]
    for a, b in zip(sizes, sizes[1:]):
        layers += [layer.Linear(a, b, bias=False, step_mode="m"), layer.BatchNorm1d(b, step_mode="m"), neuron()]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.readout = nn.Sequential(*layers), nn.Linear(sizes[-1], num_classes)

        def forward(self, x):
            functional.reset_net(self.body)
            x = x.unsqueeze(0).repeat(time_steps, *([1] * x.dim()))
            return self.readout(self.body(x).mean(0))

    return Net()


def optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    """Adam (lr 1e-3) or SGD (lr 0.01, momentum 0.9), fused on CUDA."""
    fused = next(model.parameters()).is_cuda
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=1e-3, fused=fused)
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=fused)
    raise ValueError(f"optimizer: unknown {name!r}; expected 'adam' or 'sgd'")


def training_step(model: nn.Module, optimizer_name: str | torch.optim.Optimizer, precision: str, mode: str):
    """step(x, y) -> loss: one training step of `model` in SpikingJelly's execution `mode`
    (MODES), bf16 autocast around forward and loss where precision is "bf16". optimizer_name:
    "adam" or "sgd" (`optimizer`), or an optimizer already made over model's parameters. The
    eager step is the plain PyTorch step any library's user writes (bench.runs runs snnTorch's
    and Norse's networks through it too)."""
    if mode not in MODES:
        raise ValueError(f"mode: unknown {mode!r}; expected one of {list(MODES)}")
    opt = (optimizer_name if isinstance(optimizer_name, torch.optim.Optimizer)
           else optimizer(optimizer_name, model))
    forward = torch.compile(model) if mode == "compiled" else model
    bf16 = precision == "bf16"

    def forward_backward(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = nn.functional.cross_entropy(forward(x).float(), y)
        loss.backward()
        return loss

    if mode != "graph":
        def step(x, y):
            opt.zero_grad(set_to_none=True)
            loss = forward_backward(x, y)
            opt.step()
            return loss
        return step

    from spikingjelly.activation_based._cuda_graph import StaticCudaGraph
    graph = StaticCudaGraph(forward_backward, GRAPH_WARMUP)

    def graph_step(x, y):
        opt.zero_grad(set_to_none=False)  # the graph accumulates into the gradients it captured
        loss = graph(x, y)
        opt.step()
        return loss
    return graph_step
