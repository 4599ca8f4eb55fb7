"""SpikingJelly's network-wide helpers for the modules of spikefuse.compat.spikingjelly (and
SpikingJelly's own, and spikefuse.nn's stateful neurons): `reset_net`, `detach_net`,
`set_step_mode`."""
from __future__ import annotations

from torch import nn

__all__ = ["reset_net", "detach_net", "set_step_mode"]


def _call_each(net: nn.Module, method: str, spikefuse_method: str) -> None:
    """Call `method()` on every module of net that has one, else its spikefuse twin."""
    for module in net.modules():
        for name in (method, spikefuse_method):
            fn = getattr(module, name, None)
            if callable(fn):
                fn()
                break


def reset_net(net: nn.Module) -> None:
    """SpikingJelly's reset_net: reset the state of every module of `net` that has one
    (`reset()`, or spikefuse.nn's `reset_state()`): call it between independent batches."""
    _call_each(net, "reset", "reset_state")


def detach_net(net: nn.Module) -> None:
    """SpikingJelly's detach_net: cut the graph behind every module's state, keeping its
    values (`detach()`, or spikefuse.nn's `detach_state_()`): truncated BPTT."""
    _call_each(net, "detach", "detach_state_")


def set_step_mode(net: nn.Module, step_mode: str) -> None:
    """SpikingJelly's set_step_mode: set `step_mode` ('s' or 'm') on every module of `net`
    that has one."""
    if step_mode not in ("s", "m"):
        raise ValueError(f"step_mode must be 's' or 'm', got {step_mode!r}")
    for module in net.modules():
        if hasattr(module, "step_mode"):
            module.step_mode = step_mode
