"""The kernels' base: what every fused op under spikefuse.ops builds on.

- launching: `EAGER` launches a kernel through its CachedLaunch, `TRACED` (inside the
  torch.library.triton_ops that torch.compile traces) as a wrap_triton graph node,
  `Speculate(device)` compiles it in the background (host code run on meta tensors);
- device functions the neuron kernels share: float32 arguments, the built-in surrogates, the
  reset and its partials, per-neuron parameters, and the chunk loaders and stores of the
  time-chunked kernels (a program owns BLOCK neurons and walks time K rows at a time: the
  chunk's registers, the reverse walk's prefetch, the spikes-and-potentials store);
- host helpers: x as [T, N] with its launch rule per dtype (measured, ops/lif_tuning.json),
  state buffers, cdiv, powers of 2, whether float32 matmuls take TF32 (tf32_matmuls).
"""
from __future__ import annotations

import json
import math
import os

import torch

from ..neuron_options import check_immediate_reset
from .triton_or_stub import tl, triton

RESET_CODES = {"hard": 0, "soft": 1, "none": 2, "subtract": 3}  # 3: snnTorch's, delayed (NeuronOptions)


def reset_code(reset: str, neuron: str | None = None) -> int:
    """The kernels' RESET for a mode. `neuron`: a kernel that resets at once only (all but
    LIF and CUBA) names itself, and "subtract" gets check_immediate_reset's ValueError."""
    if neuron is not None:
        check_immediate_reset(reset, neuron)
    return RESET_CODES[reset]


class Launch:
    """How the host functions below launch a kernel (a CachedLaunch) and fill a pointer the
    kernel will not read. EAGER: through the CachedLaunch, an existing tensor as the filler.
    TRACED (the bodies of the torch.library.triton_ops, what torch.compile traces):
    wrap_triton(kernel), so the launch is a graph node that inductor launches from its own
    generated code; None as the filler, so that no tensor is passed twice (functionalization
    clones each argument a kernel may write, and of two clones of one tensor keeps one)."""

    def __init__(self, traced: bool):
        self.traced = traced

    def __call__(self, launcher):
        return torch.library.wrap_triton(_jit(launcher)) if self.traced else launcher

    def unused(self, t):
        return None if self.traced else t


EAGER, TRACED = Launch(False), Launch(True)


class Speculate:
    """A launch kind for host code run on meta tensors: each launch becomes the CachedLaunch's
    speculative compile of that variant for CUDA device `device` (a background thread; nothing
    runs). The host code's allocations are meta tensors: no memory."""

    traced = False

    def __init__(self, device: int):
        self.device = device

    def __call__(self, launcher):
        return _Speculative(launcher, self.device)

    def unused(self, t):
        return t


def meta_like(t: torch.Tensor | None) -> torch.Tensor | None:
    """t's shape, strides and dtype on the meta device (no memory; host code under Speculate)."""
    return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


class _Speculative:
    def __init__(self, launcher, device):
        self.launcher, self.device = launcher, device

    def __getitem__(self, grid):
        return lambda *args, **meta: self.launcher.speculate(self.device, grid, args, meta)


def _jit(launcher):
    """The launcher's JITFunction. Under the interpreter (CPU tests) @triton.jit gives an
    InterpretedFunction, which wrap_triton leaves untraceable: a JITFunction twin that runs
    through the interpreter stands in (made once per kernel: dynamo keys on its identity)."""
    kernel = launcher.kernel
    if isinstance(kernel, triton.runtime.JITFunction):
        return kernel
    twin = getattr(launcher, "interpreted_jit", None)
    if twin is None:
        twin = launcher.interpreted_jit = _InterpretedJIT(kernel)
    return twin


class _InterpretedJIT(triton.runtime.JITFunction):
    def __init__(self, interpreted):
        super().__init__(interpreted.fn)
        self.interpreted = interpreted

    @property
    def cache_key(self):  # Triton's hashes the helpers it calls, which are not JITFunctions here
        return f"{self.fn.__module__}.{self.fn.__qualname__}"

    def run(self, *args, grid, warmup, **kwargs):
        return self.interpreted.run(*args, grid=grid, warmup=warmup, **kwargs)


@triton.jit
def f32(x):
    """A float argument as float32: Triton's launcher passes Python floats as fp32,
    inductor's generated launches (torch.compile) as fp64."""
    return tl.cast(x, tl.float32)


@triton.jit
def surrogate_grad(u, SURROGATE: tl.constexpr, alpha):
    """sg(u) for the surrogate code (see surrogate.py for the formulas)."""
    if SURROGATE == 0:  # rectangular
        return tl.where(tl.abs(u) < alpha * 0.5, 1.0 / alpha, 0.0)
    elif SURROGATE == 1:  # triangle
        return tl.maximum(1.0 - tl.abs(u) / alpha, 0.0, propagate_nan=tl.PropagateNan.ALL) / alpha  # NaN stays
    elif SURROGATE == 2:  # fast sigmoid / SuperSpike
        d = alpha * tl.abs(u) + 1.0
        return 1.0 / (d * d)
    elif SURROGATE == 3:  # sigmoid, as alpha e / (1 + e)^2 with e = exp(-alpha |u|): no 1 - sig cancelling in the tails
        e = tl.exp(-alpha * tl.abs(u))
        d = 1.0 + e
        return alpha * e / (d * d)
    else:  # atan
        z = 1.5707963267948966 * alpha * u  # pi / 2, as a literal: inductor compiles this source without its module globals
        return (alpha * 0.5) / (1.0 + z * z)


@triton.jit
def fires(u, RESET: tl.constexpr):
    """s[t] as a bool from u = h - threshold: u >= 0, or snnTorch's u > 0 for "subtract"."""
    if RESET == 3:
        return u > 0.0
    else:
        return u >= 0.0


@triton.jit
def charge(h, v, threshold, RESET: tl.constexpr):
    """h[t] from decay * v[t-1] + x[t]: less threshold * s[t-1] for "subtract", whose reset
    acts on the next step (v[t-1] = h[t-1], so s[t-1] is recomputed from v: s[-1] from v0),
    in snnTorch's order of operations; unchanged for the others. A NaN v gives a NaN h
    (decay * NaN) whatever s[t-1] reads."""
    if RESET == 3:
        return h - threshold * fires(v - threshold, RESET).to(tl.float32)
    else:
        return h


@triton.jit
def reset_potential(h, fired, threshold, v_reset, RESET: tl.constexpr):
    """v[t] from h[t] and s[t]: hard, soft (subtract) or no reset ("subtract": v = h, its
    reset is charge's), by the reference's arithmetic: NaN where the spike is (u = h - threshold NaN), and the soft reset's
    threshold * s is inf * 0 = NaN for an infinite threshold that did not fire (ALIF's
    theta after an infinite adaptation state)."""
    if RESET == 0:
        u = h - threshold
        return tl.where(u == u, tl.where(fired, v_reset, h), u)
    elif RESET == 1:
        return h - threshold * fired.to(tl.float32)
    else:
        return h


@triton.jit
def spike_value(u, fired):
    """s[t] as a float: 1.0 or 0.0, and NaN where u = h - threshold is NaN (NaN >= 0 is
    False: without this a NaN potential would read as "no spike"). Two instructions."""
    return tl.where(u == u, fired.to(tl.float32), u)


@triton.jit
def reset_partials(h, fired, threshold, v_reset, RESET: tl.constexpr, DETACH: tl.constexpr):
    """(dv[t]/dh[t] with s held, dv[t]/ds[t]) of the reset (the second 0 with detach_reset);
    the hard reset's 1 - s is NaN where the spike is (u = h - threshold NaN), as the reference's.
    "subtract": (1, dh[t+1]/ds[t]), its reset being the next step's."""
    if RESET == 0:
        u = h - threshold
        direct = tl.where(u == u, tl.where(fired, 0.0, 1.0), u)
        through_spike = 0.0 if DETACH else v_reset - h
    elif RESET == 1 or RESET == 3:
        direct = 1.0
        through_spike = 0.0 if DETACH else -threshold
    else:
        direct = 1.0
        through_spike = 0.0
    return direct, through_spike


@triton.jit
def spike_adjoint(gs, gv, through_spike, RESET: tl.constexpr, DETACH: tl.constexpr):
    """All of dL/ds[t]: the loss's, plus the reset's dL/dv[t] * dv/ds unless there is no reset
    or detach_reset cut that path (then not even 0 * a NaN dL/dv[t] is added: the reference
    has no such term). "subtract": gv is dL/dh[t+1], on which its reset acts."""
    if DETACH or RESET == 2:
        return gs
    else:
        return gs + gv * through_spike


@triton.jit
def grad_h(gs, gv, gh_next, h, fired, sg, threshold, v_reset, RESET: tl.constexpr, DETACH: tl.constexpr):
    """dL/dh[t] from dL/ds[t] and dL/dv[t]: through the spike (surrogate) and the reset.
    gh_next: dL/dh[t+1] (0 at the last step), through which the "subtract" reset reaches s[t];
    the other resets do not read it."""
    direct, through_spike = reset_partials(h, fired, threshold, v_reset, RESET, DETACH)
    g_reset = gh_next if RESET == 3 else gv
    return spike_adjoint(gs, g_reset, through_spike, RESET, DETACH) * sg + gv * direct


@triton.jit
def load_per_neuron(ptr, value, n, mask, inner, C, MODE: tl.constexpr):
    """A parameter per neuron (the decay or the threshold): MODE 0 = the float `value`,
    1 = one tensor value, 2 = one per channel."""
    if MODE == 0:
        return value
    elif MODE == 1:
        return tl.load(ptr).to(tl.float32)
    else:
        return tl.load(ptr + (n // inner) % C, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def row(X, sel):
    """Row `sel` of a [K, BLOCK] chunk. K lies in each thread's registers and the other
    rows are -0.0 (x + -0.0 == x exactly, unlike + 0.0), so this folds to a register move."""
    return tl.sum(tl.where(sel, X, -0.0), axis=0)


@triton.jit
def program_neurons(BLOCK: tl.constexpr):
    """This program's BLOCK neuron indices, declared contiguous only in runs of BLOCK // 32:
    then each thread of a one-warp program loads its own run for all K rows of a chunk. Told the
    whole block is contiguous, Triton splits a row's vector loads over fewer threads and gives
    each row to several threads (bfloat16 from BLOCK = 128), and every row extraction becomes
    warp shuffles (bfloat16 ran at half the bandwidth)."""
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if BLOCK >= 32:
        n = tl.max_contiguous(n, BLOCK // 32)
    return n


@triton.jit
def chunk_ptrs(ptr, t0, offs, N):
    """Pointers to a chunk's rows: a 64-bit row base (T*N may pass 2^31) plus the
    chunk's 32-bit offsets (K*N < 2^31 is checked by the launcher)."""
    return ptr + tl.cast(t0, tl.int64) * N + offs


@triton.jit
def load_chunk(ptr, t0, offs, k, n_mask, T, N, EVEN_N: tl.constexpr):
    """The [K, BLOCK] chunk starting at step t0 (zeros past T). Only the chunk that
    crosses T pays for a per-row mask: the masks were a third of the kernel's
    instructions when every chunk carried them."""
    K: tl.constexpr = offs.shape[0]
    ptrs = chunk_ptrs(ptr, t0, offs, N)
    if t0 + K <= T:
        if EVEN_N:
            X = tl.load(ptrs)
        else:
            X = tl.load(ptrs, mask=n_mask[None, :], other=0.0)
    else:
        X = tl.load(ptrs, mask=((t0 + k) < T)[:, None] & n_mask[None, :], other=0.0)
    return X


@triton.jit
def load_earlier_chunk(ptr, t0, offs, n_mask, N, EVEN_N: tl.constexpr):
    """A whole chunk before the current one in the reverse walk; nothing is read when
    t0 < 0 (one warp-uniform predicate: a branch here doubled the live registers)."""
    mask = tl.full(offs.shape, t0, tl.int32) >= 0
    if not EVEN_N:
        mask = mask & n_mask[None, :]
    return tl.load(chunk_ptrs(ptr, t0, offs, N), mask=mask, other=0.0)


@triton.jit
def load_or_zeros(ptr, n, n_mask, BLOCK: tl.constexpr, LOAD: tl.constexpr):
    """A per-neuron float32 vector: loaded when LOAD (an initial state, a final state's
    gradient), else zeros (nothing read)."""
    if LOAD:
        return tl.load(ptr + n, mask=n_mask, other=0.0).to(tl.float32)
    else:
        return tl.zeros([BLOCK], tl.float32)


@triton.jit
def load_earlier_chunks(x_ptr, gs_ptr, gh_ptr, t0, offs, n_mask, N, EVEN_N: tl.constexpr, HAS_GH: tl.constexpr):
    """The reverse walk's prefetch: the chunks at t0 of x, of dL/ds and, with HAS_GH, of dL/dh
    (without it, dL/ds again: a placeholder the walk does not read)."""
    X = load_earlier_chunk(x_ptr, t0, offs, n_mask, N, EVEN_N)
    GS = load_earlier_chunk(gs_ptr, t0, offs, n_mask, N, EVEN_N)
    GH = GS
    if HAS_GH:
        GH = load_earlier_chunk(gh_ptr, t0, offs, n_mask, N, EVEN_N)
    return X, GS, GH


@triton.jit
def chunk_registers(X):
    """For a [K, BLOCK] chunk: the step index k, the chunk as float32 and two float32 zero
    buffers of its shape, which a walk through the chunk fills row by row."""
    return tl.arange(0, X.shape[0]), X.to(tl.float32), tl.zeros(X.shape, tl.float32), tl.zeros(X.shape, tl.float32)


@triton.jit
def store_bits(bits_ptr, S, t, T, N):
    """A chunk's spikes S [K, BLOCK] (this program's neurons, contiguous from
    program_id * BLOCK) packed as spike_pack.pack packs the [T, N] spikes: bit n % 8 of byte
    n // 8 of row t; N % 8 == 0, so every row is whole bytes. A NaN spike packs as 1, as in pack()."""
    K: tl.constexpr = S.shape[0]
    BYTES: tl.constexpr = S.shape[1] // 8
    byte = tl.program_id(0) * BYTES + tl.arange(0, BYTES)
    octets = tl.reshape((S != 0.0).to(tl.int32), [K, BYTES, 8])
    packed = tl.sum(octets << tl.arange(0, 8)[None, None, :], axis=2)
    tl.store(bits_ptr + t.to(tl.int64)[:, None] * (N // 8) + byte[None, :], packed.to(tl.uint8),
             mask=(t < T)[:, None] & (byte < N // 8)[None, :])


@triton.jit
def store_outputs(s_ptr, h_ptr, t0, offs, k, n_mask, T, N, S, H, EVEN_N: tl.constexpr, STORE_H: tl.constexpr):
    """A chunk's spikes and, with STORE_H (return_potential), its pre-reset potentials."""
    store_chunk(s_ptr, t0, offs, k, n_mask, T, N, S, EVEN_N)
    if STORE_H:
        store_chunk(h_ptr, t0, offs, k, n_mask, T, N, H, EVEN_N)


@triton.jit
def store_chunk(ptr, t0, offs, k, n_mask, T, N, value, EVEN_N: tl.constexpr):
    """Store a [K, BLOCK] chunk starting at step t0, dropping rows past T."""
    K: tl.constexpr = offs.shape[0]
    ptrs = chunk_ptrs(ptr, t0, offs, N)
    value = value.to(ptr.dtype.element_ty)
    if t0 + K <= T:
        if EVEN_N:
            tl.store(ptrs, value)
        else:
            tl.store(ptrs, value, mask=n_mask[None, :])
    else:
        tl.store(ptrs, value, mask=((t0 + k) < T)[:, None] & n_mask[None, :])


_TUNING_FILE = os.path.join(os.path.dirname(__file__), "lif_tuning.json")
_DEFAULT_RULES = {"float32": [(0, 64, 16, 1)], "bfloat16": [(0, 32, 4, 1)], "float16": [(0, 32, 4, 1)]}


def _load_tuning() -> dict:
    """Per dtype, rules (min_neurons, BLOCK, K, num_warps) with min_neurons descending, as
    measured by benchmarks/tune_lif.py on a GPU: the first rule with N >= min_neurons holds
    (fewer neurons want narrower programs, so that enough of them fill the GPU)."""
    try:
        with open(_TUNING_FILE) as f:
            table = json.load(f)["rules"]
        return {**_DEFAULT_RULES, **{name: [tuple(rule) for rule in rules] for name, rules in table.items()}}
    except (OSError, ValueError, KeyError):
        return dict(_DEFAULT_RULES)


LAUNCH_RULES = _load_tuning()
_RULES_BY_DTYPE = {getattr(torch, name): rules for name, rules in LAUNCH_RULES.items()}


# torch >= 2.9 also names cuBLAS's TF32 choice fp32_precision; reading allow_tf32 raises once a
# caller has set that newer name, so it is read where it exists
_FP32_PRECISION = hasattr(torch.backends.cuda.matmul, "fp32_precision")


def tf32_matmuls(x: torch.Tensor) -> bool:
    """Whether float32 matmuls on x's device take TF32 inputs (cuBLAS; the recurrent kernels' dots follow it)."""
    if not x.is_cuda:
        return False
    if _FP32_PRECISION:
        return torch.backends.cuda.matmul.fp32_precision == "tf32"
    return torch.backends.cuda.matmul.allow_tf32


# host-side twins of triton.cdiv / triton.next_power_of_2, which are ConstexprFunctions in
# newer Triton: several us a call, on every launch
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def kernel_arg(tensor, unused):
    """A kernel's pointer argument: the tensor (made contiguous: the kernels index it as
    [N] or [T, N]), or the filler of a pointer the kernel will not read."""
    return unused if tensor is None else tensor.contiguous()


def time_major(x: torch.Tensor):
    """(x contiguous, T, N, BLOCK, K, num_warps): x as [T, N] neurons per step, and the launch
    rule for its N and dtype."""
    x = x.contiguous()
    T = x.shape[0]
    N = x.numel() // T
    return (x, T, N, *launch_config(N, x.dtype))


def state_buffer(x: torch.Tensor, wanted: bool):
    """A float32 buffer shaped like x[0] (a neuron state, or its gradient), or None unless wanted."""
    return x.new_empty(x.shape[1:], dtype=torch.float32) if wanted else None


def launch_config(num_neurons: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK, K, num_warps). One warp per program: with more, Triton spreads a chunk's
    K rows over warps and every row extraction becomes a shared-memory reduction (10x
    slower in an earlier sweep on an H200)."""
    for min_neurons, BLOCK, K, warps in _RULES_BY_DTYPE[dtype]:
        if num_neurons >= min_neurons:
            break
    if K * max(num_neurons, BLOCK) >= 2**31:
        raise ValueError(f"x has {num_neurons} neurons per time step; the fused LIF supports "
                         f"fewer than {2**31 // K} (use backend='reference')")
    return BLOCK, K, warps


def param_mode(tensor):
    """load_per_neuron's MODE for a decay or threshold: 0 = a float, 1 = one tensor value,
    2 = one per channel."""
    return 0 if tensor is None else 1 if tensor.numel() == 1 else 2


def channel_layout(shape, *params):
    """(channels, elements per channel within one sample) of x [T, B, C, ...] where one of
    the params is per channel; else (1, 1), the kernels' launch arguments of before."""
    if any(p is not None and p.numel() > 1 for p in params):
        return shape[2], math.prod(shape[3:])
    return 1, 1


def or_empty(t, like):
    """t, or an empty float32 tensor: an op may not return None (nor one tensor twice)."""
    return t if t is not None else like.new_empty(0, dtype=torch.float32)
