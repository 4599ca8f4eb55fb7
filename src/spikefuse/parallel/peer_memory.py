"""GPU peer memory through PyTorch's symmetric memory: whether a group can have it, and one
buffer of it mapped by every rank. SyncBN's exchanges (sync_bn.py) and the gradient buckets
(grad_peer.py) travel through it where every rank of the group runs on this host with a GPU
of its own."""
from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist


def symmetric_unavailable(tensor: torch.Tensor, group) -> str:
    """Why peer memory cannot serve `tensor` on `group` ('' where it can). Decided from facts
    every rank of one host shares, so every rank decides alike."""
    if not tensor.is_cuda:
        return "it takes CUDA tensors"
    try:
        from torch.distributed import _symmetric_memory as symm
    except ImportError:
        symm = None
    if not (hasattr(symm, "empty") and hasattr(symm, "rendezvous")):
        return f"this torch ({torch.__version__}) has no torch.distributed._symmetric_memory.empty/rendezvous"
    if dist.get_backend(group) != "nccl":
        return f"the process group's backend is {dist.get_backend(group)}, not nccl"
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local is None or int(local) != dist.get_world_size():
        return "it needs every rank on this host (LOCAL_WORLD_SIZE == WORLD_SIZE, as torchrun sets on one host)"
    if torch.cuda.device_count() < int(local):  # two ranks' exchange kernels on one GPU hung in a test
        return "it needs a GPU of its own for every rank"
    gpus = range(int(local))  # rank r on GPU r, as init_data_parallel places them
    if any(a != b and not torch.cuda.can_device_access_peer(a, b) for a in gpus for b in gpus):
        return "the GPUs cannot all reach each other's memory (no peer access between some pair)"
    return ""


def group_name(group) -> str:
    return (group if group is not None else dist.group.WORLD).group_name


def enable(group) -> None:
    """Symmetric memory switched on for `group` (torch < 2.11 needs it; later ones warn that
    every group has it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.distributed import _symmetric_memory as symm

        if hasattr(symm, "enable_symm_mem_for_group"):
            symm.enable_symm_mem_for_group(group_name(group))


def mapped(shape, dtype: torch.dtype, device, group, *, purpose: str, fallback: str) -> tuple:
    """(this rank's zeroed buffer, its symmetric-memory handle): a collective, every rank of
    `group` in the same order. Refused inside a CUDA graph capture (the buffer must be zero
    before any rank may write a peer's). On failure a RuntimeError naming `purpose` and the
    `fallback` a user can take."""
    from torch.distributed import _symmetric_memory as symm

    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{purpose} sets up its peer memory at its first training step, which cannot be "
                           "inside a CUDA graph capture: run one step eagerly before capturing")
    try:
        buffer = symm.empty(shape, dtype=dtype, device=device)
        buffer.zero_()
        torch.cuda.current_stream(device).synchronize()
        handle = symm.rendezvous(buffer, group_name(group))
    except Exception as e:  # every rank fails alike here (same host, same torch)
        raise RuntimeError(f"{purpose} could not set up its peer memory ({type(e).__name__}: "
                           f"{(str(e).splitlines() or [''])[0][:200]}); {fallback}") from e
    return buffer, handle
