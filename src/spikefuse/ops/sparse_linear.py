"""Linear over binary spikes with a sparse backward: work only on the outputs that carry
gradient.

Downstream of a LIF with a secondary gradient threshold (grad_threshold, Perez-Nieves &
Goodman), the gradient gy [R, OUT] reaching this layer (R = T x batch rows) is zero in
every column whose neuron never came near threshold. Those columns contribute nothing,
so backward first flags the carrying columns U (nonzero anywhere in gy), lists them (an
index list with its count on the device, spikefuse.ops.spike_index), gathers gy[:, U] into
a compact block, and then
- input gradient  gs = gy[:, U] @ W[U, :]     (reads |U| rows of W, not all of W),
- weight gradient gw[U, :] = gy[:, U]^T @ s   (|U| rows computed; the rest is zero),
each a Triton matmul whose loop runs to the device-side count, so the launch shapes are
static and a CUDA graph captures them. With a `capacity` (a host-side number of columns,
which dispatch sets from the largest count it measured, spikefuse.nn.sparse_linear), the
first `capacity` listed columns go through cuBLAS instead, on W's rows gathered into a
zero-padded block (and the weight gradient's rows scattered back): at the IPU x4 layer, 800
rows, 20 % carrying, the Triton kernels ran at 84 (input gradient) and 132 TFLOPS (weight
gradient) on an H200 against cuBLAS's 270 and 190 on the dense products
(benchmarks/results/s29-2026-11-28/). The Triton kernels then take only the columns past
the capacity, so a step that carries more stays exact. The weight gradient is returned
dense (zero outside U: any optimizer reads it as usual) with a note of U on the weight
(spikefuse.ops.grad_rows), so that spikefuse.optim.LazyAdam updates only those rows without
searching the whole gradient for them. Forward stays cuBLAS's dense matmul: at the IPU
networks' sizes (T x B >= 100 rows, 1-2 % activity) summing the active rows of W per row
reads about as many bytes as the dense matmul reads W once (docs/sparse.md).

The gradients equal the dense backward's (same products, summed in another order);
`carry` (optional, float64 [3], on the device) accumulates the number of carrying columns,
of backward calls and the largest count, which dispatch reads between epochs. Spikes s are
saved as bits like spikefuse.ops.spike_linear, and the weight-gradient kernel reads those
bits itself.

A backward with create_graph (second derivatives) takes the dense backward in differentiable
torch ops on the unpacked bits plus spike_linear's one-element graph edge to s, so second
derivatives equal nn.Linear's (the kernels' gradients carry no graph: they were lost).
"""
from __future__ import annotations

import torch

from .kernel_base import cdiv, tf32_matmuls
from . import grad_rows
from .launch import cached_launch, fused_or
from .spike_index import line_flags, nonzero_lines
from .spike_linear import _backward as dense_backward, graph_edge, linear_forward, saved_spikes, spikes_with_graph
from .spike_pack import pack, use_triton

from .triton_or_stub import tl, triton


@cached_launch
@triton.jit
def _gather_columns_kernel(gy_ptr, cols_ptr, count_ptr, gyt_ptr, R, OUT, CAP, BR: tl.constexpr, BK: tl.constexpr):
    """gyt[k, r] = gy[r, cols[k]] for k < count, and 0 for count <= k < CAP (the cuBLAS block's
    padding): a tile of BR rows by BK listed columns per program (the programs past both
    have nothing to do)."""
    k = tl.program_id(1) * BK + tl.arange(0, BK)
    n = tl.load(count_ptr)
    end = tl.maximum(n, CAP)
    if tl.program_id(1) * BK < end:
        r = tl.program_id(0) * BR + tl.arange(0, BR)
        col = tl.load(cols_ptr + k, mask=k < n, other=0).to(tl.int64)
        g = tl.load(gy_ptr + r.to(tl.int64)[:, None] * OUT + col[None, :],
                    mask=(r < R)[:, None] & (k < n)[None, :], other=0.0)
        tl.store(gyt_ptr + k.to(tl.int64)[None, :] * R + r[:, None], g, mask=(r < R)[:, None] & (k < end)[None, :])


@cached_launch
@triton.jit
def _listed_rows_kernel(src_ptr, cols_ptr, count_ptr, dst_ptr, IN, CAP, SCATTER: tl.constexpr,
                        BK: tl.constexpr, BI: tl.constexpr):
    """Between a matrix's listed rows and a block of them, for k < min(count, CAP): gather
    dst[k] = src[cols[k]] (and dst[k] = 0 for count <= k < CAP: the block's padding), or
    scatter dst[cols[k]] = src[k] (SCATTER)."""
    k = tl.program_id(1) * BK + tl.arange(0, BK)
    i = tl.program_id(0) * BI + tl.arange(0, BI)
    n = tl.load(count_ptr)
    taken = (k < n) & (k < CAP)
    col = tl.load(cols_ptr + k, mask=taken, other=0).to(tl.int64)
    listed = col[:, None] * IN + i[None, :]
    packed = k.to(tl.int64)[:, None] * IN + i[None, :]
    in_row = (i < IN)[None, :]
    if SCATTER:
        v = tl.load(src_ptr + packed, mask=taken[:, None] & in_row, other=0.0)
        tl.store(dst_ptr + listed, v.to(dst_ptr.dtype.element_ty), mask=taken[:, None] & in_row)
    else:
        v = tl.load(src_ptr + listed, mask=taken[:, None] & in_row, other=0.0)
        tl.store(dst_ptr + packed, v.to(dst_ptr.dtype.element_ty), mask=(k < CAP)[:, None] & in_row)


@cached_launch
@triton.jit
def _input_grad_kernel(gyt_ptr, w_ptr, cols_ptr, count_ptr, gs_ptr, R, IN, FIRST,
                       BR: tl.constexpr, BI: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
                       ADD: tl.constexpr):
    """gs[r, i] = sum_{FIRST <= k < count} gyt[k, r] * w[cols[k], i], added to gs when ADD
    (then nothing is done where count <= FIRST)."""
    n = tl.load(count_ptr)
    if ADD and n <= FIRST:
        return
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    i = tl.program_id(1) * BI + tl.arange(0, BI)
    r_mask, i_mask = r < R, i < IN
    acc = tl.zeros([BR, BI], tl.float32)
    if ADD:
        acc += tl.load(gs_ptr + r.to(tl.int64)[:, None] * IN + i[None, :],
                       mask=r_mask[:, None] & i_mask[None, :], other=0.0).to(tl.float32)
    for k0 in range(FIRST, n, BK):
        k = k0 + tl.arange(0, BK)
        k_mask = k < n
        col = tl.load(cols_ptr + k, mask=k_mask, other=0).to(tl.int64)
        a = tl.load(gyt_ptr + k.to(tl.int64)[None, :] * R + r[:, None],
                    mask=r_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
        b = tl.load(w_ptr + col[:, None] * IN + i[None, :],
                    mask=k_mask[:, None] & i_mask[None, :], other=0.0).to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    tl.store(gs_ptr + r.to(tl.int64)[:, None] * IN + i[None, :], acc.to(gs_ptr.dtype.element_ty),
             mask=r_mask[:, None] & i_mask[None, :])


@cached_launch
@triton.jit
def _weight_grad_kernel(gyt_ptr, bits_ptr, cols_ptr, count_ptr, gw_ptr, R, IN, FIRST, PROGRAMS,
                        BK: tl.constexpr, BI: tl.constexpr, BR: tl.constexpr, PRECISION: tl.constexpr,
                        ALIGNED: tl.constexpr):
    """gw[cols[k], i] = sum_r gyt[k, r] * s[r, i] for FIRST <= k < count (other rows untouched), the
    spikes s [R, IN] read as the forward saved them, bits (spike_pack's layout): 1/32 of
    their float bytes, and no unpacking launch. PROGRAMS persistent programs walk the
    count's tiles (a grid over every possible tile would launch tens of thousands of
    programs with nothing to do)."""
    n = tl.load(count_ptr)
    i_tiles = tl.cdiv(IN, BI)
    for tile in range(tl.program_id(0), tl.cdiv(tl.maximum(n - FIRST, 0), BK) * i_tiles, PROGRAMS):
        k = FIRST + (tile // i_tiles) * BK + tl.arange(0, BK)
        i = (tile % i_tiles) * BI + tl.arange(0, BI)
        k_mask, i_mask = k < n, i < IN
        acc = tl.zeros([BK, BI], tl.float32)
        for r0 in range(0, R, BR):
            r = r0 + tl.arange(0, BR)
            r_mask = r < R
            a = tl.load(gyt_ptr + k.to(tl.int64)[:, None] * R + r[None, :],
                        mask=k_mask[:, None] & r_mask[None, :], other=0.0).to(tl.float32)
            if ALIGNED:  # every row starts on a byte: load the tile's bytes, expand them in registers
                byte = (tile % i_tiles) * (BI // 8) + tl.arange(0, BI // 8)
                packed = tl.load(bits_ptr + r.to(tl.int64)[:, None] * (IN // 8) + byte[None, :],
                                 mask=r_mask[:, None] & (byte < IN // 8)[None, :], other=0).to(tl.int32)
                b = tl.reshape((packed[:, :, None] >> tl.arange(0, 8)[None, None, :]) & 1, [BR, BI]).to(tl.float32)
            else:
                element = r.to(tl.int64)[:, None] * IN + i[None, :]
                byte = tl.load(bits_ptr + (element >> 3), mask=r_mask[:, None] & i_mask[None, :], other=0)
                b = ((byte.to(tl.int32) >> (element & 7).to(tl.int32)) & 1).to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        col = tl.load(cols_ptr + k, mask=k_mask, other=0).to(tl.int64)
        tl.store(gw_ptr + col[:, None] * IN + i[None, :], acc.to(gw_ptr.dtype.element_ty),
                 mask=k_mask[:, None] & i_mask[None, :])


BLOCK_TILE = (32, 128)  # (rows, columns) a program of the block's gather and scatter moves
# tiles (rows, inputs, carrying columns, warps, stages) of the input gradient and (carrying
# columns, inputs, rows, warps, stages) of the weight gradient; benchmarks/tune_sparse_linear.py
# times others
INPUT_GRAD_TILES = (32, 128, 32, 4, 3)
WEIGHT_GRAD_TILES = (64, 128, 32, 4, 3)


def persistent_programs(device: torch.device) -> int:
    """Programs for a persistent loop: 4 per SM on a GPU (a few under the interpreter)."""
    if device.type != "cuda":
        return 4
    return 4 * torch.cuda.get_device_properties(device).multi_processor_count


def gather_carrying(gy2: torch.Tensor, capacity: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gyt [OUT, R], cols [OUT] int32, count [1] int32) for gy2 [R, OUT] (contiguous): the
    columns with any nonzero (NaN included) in increasing order, and gyt[k] = gy2[:, cols[k]];
    rows from the count up to `capacity` are zero, the rest past both never written nor read.
    Three launches: flags, the list (one program), the gather (one program per tile)."""
    R, OUT = gy2.shape
    cols, count = carrying_columns(gy2)
    gyt = torch.empty(OUT, R, device=gy2.device, dtype=gy2.dtype)
    if R > 0 and OUT > 0:
        _gather_columns_kernel[(cdiv(R, 32), cdiv(OUT, 64))](gy2, cols, count, gyt, R, OUT, capacity, BR=32, BK=64)
    return gyt, cols, count


def _block_grid(rows: int, width: int) -> tuple[int, int]:
    """The grid of the block's gather or scatter: (column tiles, row tiles)."""
    return cdiv(width, BLOCK_TILE[1]), cdiv(rows, BLOCK_TILE[0])


def input_grad(gyt, weight, cols, count, precision, capacity: int = 0):
    """gs [R, IN] = gy[:, U] @ weight[U, :] (U = cols[:count]) from the gathered gyt [OUT, R]
    (zero from the count to `capacity`): U's first `capacity` columns through cuBLAS, the rest
    in the Triton kernel."""
    R, IN = gyt.shape[1], weight.shape[1]
    w = weight if weight.is_contiguous() else weight.contiguous()
    gs = torch.empty(R, IN, device=gyt.device, dtype=gyt.dtype)
    if R > 0 and IN > 0:
        if capacity:
            block = torch.empty(capacity, IN, device=gyt.device, dtype=gyt.dtype)
            _listed_rows_kernel[_block_grid(capacity, IN)](w, cols, count, block, IN, capacity, SCATTER=False,
                                                          BK=BLOCK_TILE[0], BI=BLOCK_TILE[1])
            torch.mm(gyt[:capacity].t(), block, out=gs)
        br, bi, bk, warps, stages = INPUT_GRAD_TILES
        _input_grad_kernel[(cdiv(R, br), cdiv(IN, bi))](gyt, w, cols, count, gs, R, IN, capacity, BR=br, BI=bi,
                                                          BK=bk, PRECISION=precision, ADD=capacity > 0,
                                                          num_warps=warps, num_stages=stages)
    return gs


def weight_grad(gyt, bits, cols, count, gw, precision, capacity: int = 0):
    """Rows cols[:count] of gw [OUT, IN] from the gathered gyt [OUT, R] (zero from the count to
    `capacity`) and the spikes' bits (pack of s [R, IN]): the first `capacity` through cuBLAS
    (on the spikes unpacked as the dense backward unpacks them) and scattered, the rest in
    the Triton kernel."""
    OUT, R = gyt.shape
    IN = gw.shape[1]
    if R > 0 and OUT > 0 and IN > 0:
        if capacity:
            block = gyt[:capacity] @ saved_spikes(bits, (R, IN), gyt.dtype)
            _listed_rows_kernel[_block_grid(capacity, IN)](block, cols, count, gw, IN, capacity, SCATTER=True,
                                                          BK=BLOCK_TILE[0], BI=BLOCK_TILE[1])
        bk, bi, br, warps, stages = WEIGHT_GRAD_TILES
        programs = min(persistent_programs(gyt.device), cdiv(OUT, bk) * cdiv(IN, bi))
        _weight_grad_kernel[(programs,)](gyt, bits, cols, count, gw, R, IN, capacity, programs, BK=bk, BI=bi,
                                         BR=br, PRECISION=precision, ALIGNED=IN % 8 == 0, num_warps=warps,
                                         num_stages=stages)


def _precision(t: torch.Tensor) -> str:
    """TF32 exactly when torch's float32 matmuls would use it (the dense path's rule, as in
    the recurrent LIF's kernels)."""
    return "tf32" if tf32_matmuls(t) else "ieee"


def carrying_columns(gy2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cols [OUT] int32, count [1] int32): the columns of gy2 [R, OUT] with any nonzero."""
    return nonzero_lines(gy2, over=0)


def sparse_backward(gy2, bits, weight, need_s: bool, need_w: bool, carry=None, capacity: int = 0):
    """(gs [R, IN] or None, gw [OUT, IN] or None) for gy2 [R, OUT] (contiguous) and the
    spikes' bits (pack of s [R, IN]; only read for gw). gw's rows that can be nonzero are
    noted on `weight` (grad_rows). capacity: the carrying columns cuBLAS takes (the module's
    docstring), at most OUT."""
    capacity = min(capacity, gy2.shape[1])
    gyt, cols, count = gather_carrying(gy2, capacity)
    precision = _precision(gy2)
    gs = input_grad(gyt, weight, cols, count, precision, capacity) if need_s else None
    gw = None
    if need_w:
        gw = torch.zeros_like(weight, memory_format=torch.contiguous_format)
        weight_grad(gyt, bits, cols, count, gw, precision, capacity)
        grad_rows.note(weight, gw, cols, count)
    if carry is not None:  # last: a launch above that raised (a kernel compiling) counted nothing
        count_carrying(carry, count)
    return gs, gw


def count_carrying(carry: torch.Tensor, count: torch.Tensor) -> None:
    """carry (float64 [3], on the device): + the count, + one backward, the largest count."""
    carry[0] += count[0]
    carry[1] += 1
    torch.maximum(carry[2], count[0].to(carry.dtype), out=carry[2])


class SparseSpikeLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s, weight, bias, bits, carry, sparse, capacity=0, edge=None):
        """bits: pack(s), or None when no weight gradient will be taken. sparse=False runs
        the dense backward (cuBLAS) but still counts the carrying columns into `carry`.
        edge: spike_linear.graph_edge(s), s's place in the graph for a create_graph backward."""
        ctx.save_for_backward(bits, weight, edge)
        ctx.s_shape, ctx.s_dtype, ctx.has_bias = s.shape, s.dtype, bias is not None
        ctx.carry, ctx.sparse, ctx.capacity = carry, sparse, capacity
        return linear_forward(s, weight, bias)

    @staticmethod
    def backward(ctx, gy):
        packed, weight, edge = ctx.saved_tensors
        need_s, need_w, need_b = ctx.needs_input_grad[:3]
        need_b = need_b and ctx.has_bias
        graph = torch.is_grad_enabled()  # create_graph: the dense products in torch ops, with s's graph

        def dense():
            grad_rows.clear(weight)
            if ctx.carry is not None:
                with torch.no_grad():
                    flags = line_flags(gy.detach().reshape(-1, gy.shape[-1]), over=0)
                    count_carrying(ctx.carry, flags.sum().reshape(1))
            s = spikes_with_graph(packed, edge, ctx.s_shape, gy.dtype) if graph and need_w else None
            return (*dense_backward(gy, packed, weight, ctx.s_shape, ctx.s_dtype, need_s, need_w, need_b, s=s),
                    None, None, None, None, None)
        if graph or not ctx.sparse or not use_triton(gy):  # or dense, or no Triton here
            return dense()
        gy2 = gy.reshape(-1, gy.shape[-1]).contiguous()
        # while a sparse kernel compiles in the background (ops/launch.py), the dense backward
        sparse = fused_or(lambda: sparse_backward(gy2, packed, weight, need_s, need_w, ctx.carry, ctx.capacity),
                          lambda: None)
        if sparse is None:
            return dense()
        gs, gw = sparse
        gs = gs.view(ctx.s_shape).to(ctx.s_dtype) if need_s else None
        gb = gy2.sum(0).to(weight.dtype) if need_b else None
        return gs, gw, gb, None, None, None, None, None


def sparse_spike_linear(s: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        bits: torch.Tensor | None = None, carry: torch.Tensor | None = None,
                        sparse: bool = True, capacity: int = 0) -> torch.Tensor:
    """F.linear over binary spikes s [*, IN] with the sparse backward above (the dense one
    when not `sparse`). bits: pack(s) when the producer made them. carry: float64 [3]
    accumulator (carrying columns, backward calls, the largest count). capacity: the carrying
    columns the backward's cuBLAS products take (0: the Triton kernels take all)."""
    save = weight.requires_grad and torch.is_grad_enabled()
    if save and bits is None:
        bits = pack(s)
    return SparseSpikeLinearFunction.apply(s, weight, bias, bits if save else None, carry, sparse, capacity,
                                           graph_edge(s, save))
