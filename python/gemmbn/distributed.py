"""Batch statistics over every rank of a process group (nn.SyncBatchNorm's semantics), on the PyTorch route.

Forward with batch statistics: each rank's per-column (count, mean, M2) of y, all-gathered and merged in
rank order in float64 (the pairwise merge of Chan et al.), so every rank holds bitwise the same global mean
and biased variance. The running statistics move with the global mean and the unbiased variance over the
global count. Ranks may hold different numbers of rows, none included.
Backward: the normalization's two column sums (sum dout, sum dout (y - mean); float64 [2, N]) are gathered
and added in rank order, so x's gradient is that of single-process training on the concatenated batch;
gamma's and beta's are the rank's own sums, which DDP then reduces across ranks, as with nn.SyncBatchNorm.
Eval mode communicates nothing. Collectives run through torch.distributed on the current stream, and the
forward reads no value back to the host.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
from torch import Tensor, nn

from . import fused
from . import precision as precision_mod
from ._native import Refused, fused_unavailable_reason
from .backward import _fused_grads, _reference_grads, grad_y_batch_statistics
from .fallback import warn_once
from .reference import _update_running_stats, linear_scale, statistics_dtype

# The synchronized layer on the fused launches (_SynchronizedFusedLayer) wherever they run: a training step about as
# fast as the unsynchronized layer's on one NCCL rank, the PyTorch route's several times slower (perf/NOTES.md v20).
# GEMMBN_SYNC_FUSED=0 in every rank's environment takes the PyTorch route (read per call: A/B runs, or to rule the
# kernels out).
SYNC_FUSED = "GEMMBN_SYNC_FUSED"


def _gather_in_rank_order(t: Tensor, process_group) -> list[Tensor]:
    """Every rank's t (same shape everywhere), indexed by rank."""
    gathered = [torch.empty_like(t) for _ in range(dist.get_world_size(process_group))]
    dist.all_gather(gathered, t.contiguous(), group=process_group)
    return gathered


def _local_moments(y: Tensor) -> Tensor:
    """[3, N] float64: the rows, mean and M2 of y's columns (what every rank contributes, on either route)."""
    local = y.detach().to(torch.float64)
    count = torch.full((y.shape[1],), float(y.shape[0]), dtype=torch.float64, device=y.device)
    mean = local.mean(0) if y.shape[0] else torch.zeros_like(count)
    return torch.stack([count, mean, ((local - mean) ** 2).sum(0)])


def global_moments(y: Tensor, process_group) -> tuple[Tensor, Tensor, Tensor]:
    """(count, mean, biased variance) per column of y's rows on every rank, float64 [N] each."""
    return _merge_in_rank_order(_gather_in_rank_order(_local_moments(y), process_group))


def _merge_in_rank_order(gathered: list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """(count, mean, biased variance) [N] of the ranks' [3, N] moments, merged in rank order in float64 (Chan et al.'s
    pairwise merge): every rank gets bitwise the same."""
    count = gathered[0][0].to(torch.float64)
    total_count, total_mean, total_m2 = (torch.zeros_like(count) for _ in range(3))
    for n, m, s in (g.to(torch.float64) for g in gathered):
        merged = total_count + n
        weight = torch.where(merged > 0, n / merged, torch.zeros_like(n))  # ranks without rows add nothing
        delta = m - total_mean
        total_m2 = total_m2 + s + delta * delta * total_count * weight
        total_mean = total_mean + delta * weight
        total_count = merged
    return total_count, total_mean, total_m2 / total_count


def _normalized(y: Tensor, gamma: Tensor | None, beta: Tensor | None, mean: Tensor, invstd: Tensor) -> Tensor:
    """(y - mean) invstd gamma + beta in the statistics dtype, rounded to y's."""
    math = statistics_dtype(y.dtype)
    out = (y.to(math) - mean) * invstd
    out = out if gamma is None else out * gamma.to(math)
    out = out if beta is None else out + beta.to(math)
    return out.to(y.dtype)


def _local_sums(dout: Tensor, y: Tensor, mean: Tensor) -> Tensor:
    """[2, N] float64: this batch's column sums of dout and dout d, d = y - mean (the global mean), what a rank
    contributes to the backward's gather on either route (the first two rows of fused.batch_norm_backward_sums).
    Summed in float64, as the gathered moments are: float32 sums of 1000 rows were 1.7x eager's error in dbeta
    (perf/NOTES.md v19)."""
    math = statistics_dtype(y.dtype)
    dout = dout.to(math)
    return torch.stack([dout.sum(0, dtype=torch.float64), (dout * (y.to(math) - mean.to(math))).sum(0, dtype=torch.float64)])


def _sum_in_rank_order(local: Tensor, process_group) -> Tensor:
    """The ranks' local tensors added in rank order: bitwise the same on every rank."""
    total = torch.zeros_like(local)
    for sums in _gather_in_rank_order(local, process_group):
        total = total + sums
    return total


def _grad_y_over_ranks(
    dout: Tensor, y: Tensor, mean: Tensor, invstd: Tensor, gamma: Tensor | None, total: Tensor, rows: Tensor
) -> Tensor:
    """dL/dy in the statistics dtype from the ranks' summed _local_sums (total) over every rank's rows."""
    math = statistics_dtype(y.dtype)
    xhat = (y.to(math) - mean) * invstd
    a = invstd if gamma is None else invstd * gamma.to(math)
    sum_dout_xhat = (total[1] * invstd.to(torch.float64)).to(math)
    return grad_y_batch_statistics(dout.to(math), xhat, a, total[0].to(math), sum_dout_xhat, rows.to(math))


class _SynchronizedNormalization(torch.autograd.Function):
    """out = (y - mean) invstd gamma + beta with global statistics; the backward gathers its column sums."""

    @staticmethod
    def forward(ctx, y, gamma, beta, mean, invstd, count, process_group):
        ctx.save_for_backward(y, gamma, mean, invstd, count)
        ctx.process_group, ctx.has_beta = process_group, beta is not None
        return _normalized(y, gamma, beta, mean, invstd)

    @staticmethod
    def backward(ctx, dout):
        y, gamma, mean, invstd, count = ctx.saved_tensors
        local = _local_sums(dout, y, mean)
        grad_y = _grad_y_over_ranks(dout, y, mean, invstd, gamma, _sum_in_rank_order(local, ctx.process_group),
                                    count)  # fmt: skip
        dgamma = None if gamma is None else (local[1] * invstd.to(torch.float64)).to(gamma.dtype)
        dbeta = local[0].to(y.dtype) if ctx.has_beta else None
        return grad_y.to(y.dtype), dgamma, dbeta, None, None, None, None


class _SynchronizedFusedLayer(torch.autograd.Function):
    """The layer's batch-statistics step over a process group's ranks on the fused launches.
    Forward: fused.train_moments (y and this rank's [3, N] moments), the ranks' moments gathered in rank order,
    fused.normalize_from_moments (the running statistics moved in the same launch; a rank without rows runs it on a
    row of zeros, so that its running statistics are bitwise the other ranks').
    Backward: fused.batch_norm_backward_sums, the ranks' sums gathered and added in rank order, batch_norm_backward
    from them (dz and the [N] gradients), the GEMMs (backward._fused_grads): the unsynchronized backward's two passes
    over dout and y. Each direction communicates once, [3, N] float64, as the PyTorch route does, so ranks on either
    route agree; a launch refused after the collective is made up for in PyTorch ops."""

    @staticmethod
    def forward(ctx, x, weight, bias, scale, gamma, beta, gemm_kind, process_group, running):
        N = weight.shape[0]
        if x.shape[0]:
            y, moments = fused.train_moments(x, weight, bias, scale, gemm_kind)  # refused: nothing communicated yet
            moments = moments.to(torch.float64)
        else:
            y = x.new_empty((0, N))
            moments = torch.zeros(3, N, dtype=torch.float64, device=x.device)  # no rows: adds nothing to the merge
        gathered = _gather_in_rank_order(moments, process_group)
        rank_moments = torch.stack(gathered)
        count = rank_moments[:, 0].sum(0)  # every rank's rows; exact in float64
        running_mean, running_var, num_batches_tracked, momentum, eps = running
        if num_batches_tracked is not None:
            num_batches_tracked.add_(1)  # normalize_from_moments reads the count (momentum=None)
        try:
            rows = y if y.shape[0] else y.new_zeros((1, N))
            out, mean, invstd = fused.normalize_from_moments(rows, rank_moments.float(), gamma, beta, *running)
            out = out[: y.shape[0]]
        except Refused as refusal:  # after the collective: the same statistics, merged in PyTorch
            warn_once(refusal.reason)
            mean, invstd = _move_running_statistics(y, *_merge_in_rank_order(gathered), running_mean, running_var,
                                                    num_batches_tracked, momentum, eps, count_batch=False)  # fmt: skip
            out = _normalized(y, gamma, beta, mean, invstd)
        ctx.save_for_backward(x, weight, bias, scale, gamma, y, mean, invstd, count[:1])
        ctx.gemm_kind, ctx.process_group = gemm_kind, process_group
        ctx.beta_dtype = None if beta is None else beta.dtype
        return out

    @staticmethod
    def backward(ctx, dout):
        x, weight, bias, scale, gamma, y, mean, invstd, rows = ctx.saved_tensors
        needs = list(ctx.needs_input_grad[:6])
        needs[2], needs[4] = needs[2] and bias is not None, needs[4] and gamma is not None
        needs[5] = needs[5] and ctx.beta_dtype is not None
        dout = dout if dout.dtype == y.dtype else dout.to(y.dtype)
        local = None
        if y.shape[0]:
            try:
                local = fused.batch_norm_backward_sums(dout, y, mean, invstd)
            except Refused as refusal:  # the collective must still run: PyTorch's sums
                warn_once(refusal.reason)
        local = _local_sums(dout, y, mean) if local is None else local  # no rows: zeros
        total = _sum_in_rank_order(local[:2], ctx.process_group)  # sum d stays the rank's (its share of sum grad_y)
        if y.shape[0]:
            try:
                grads = _fused_grads(ctx.gemm_kind, dout, x, weight, bias, scale, gamma, y, mean, invstd, True, needs,
                                     over_ranks=(local, total, rows))  # fmt: skip
                return (*grads, None, None, None)
            except Refused as refusal:
                warn_once(refusal.reason)
        # PyTorch ops (and a rank without rows: its gradients of the parameters are zeros, x's empty).
        grad_y = _grad_y_over_ranks(dout, y, mean, invstd, gamma, total, rows)
        math = grad_y.dtype
        explicit = {precision_mod.SPLIT_FP32: "highest", precision_mod.TF32: "high"}.get(ctx.gemm_kind)
        with precision_mod.float32_matmul_precision(explicit) if explicit else contextlib.nullcontext():
            grads = _reference_grads(grad_y, grad_y.sum(0), (grad_y * y.to(math)).sum(0), x, weight, bias, scale,
                                     needs)  # fmt: skip
        dgamma = (local[1] * invstd.to(torch.float64)).to(gamma.dtype) if needs[4] else None
        dbeta = local[0].to(ctx.beta_dtype) if needs[5] else None
        return (*grads, dgamma, dbeta, None, None, None)


def fused_route(x: Tensor) -> bool:
    """Whether the synchronized forward takes the fused launches (SYNC_FUSED not 0, x on a GPU they run
    on, eager: traced code keeps the PyTorch route)."""
    return (os.environ.get(SYNC_FUSED) != "0" and not torch.compiler.is_compiling()
            and fused_unavailable_reason(x) is None)  # fmt: skip


def _forward_train_fused(
    x: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor, gamma: Tensor | None, beta: Tensor | None,
    running_mean: Tensor | None, running_var: Tensor | None, num_batches_tracked: Tensor | None,
    momentum: float | None, eps: float, process_group,
) -> Tensor | None:
    """forward_train on the fused launches (_SynchronizedFusedLayer). None if the first launch refused (nothing
    communicated yet: the caller takes the PyTorch route)."""
    gemm_kind = precision_mod.resolve(x.dtype, precision_mod.FOLLOW_TORCH)  # the caller set the layer's precision
    running = (running_mean, running_var, num_batches_tracked, momentum, eps)
    try:
        return _SynchronizedFusedLayer.apply(x, weight, bias, scale, gamma, beta, gemm_kind, process_group, running)
    except Refused as refusal:
        warn_once(refusal.reason)
        return None


def forward_train(
    x: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor, gamma: Tensor | None, beta: Tensor | None,
    running_mean: Tensor | None, running_var: Tensor | None, num_batches_tracked: Tensor | None,
    momentum: float | None, eps: float, process_group,
) -> Tensor:
    """linear_scale_batch_norm's batch-statistics forward with the statistics of every rank in process_group: the
    fused launches where fused_route allows them, else the PyTorch route (saying why, once)."""
    if fused_route(x):
        out = _forward_train_fused(x, weight, bias, scale, gamma, beta, running_mean, running_var,
                                   num_batches_tracked, momentum, eps, process_group)  # fmt: skip
        if out is not None:
            return out
    else:
        why = "traced code" if torch.compiler.is_compiling() else f"{SYNC_FUSED}=0"
        warn_once(fused_unavailable_reason(x) or f"batch statistics over a process group run on the PyTorch route ({why})")
    y = linear_scale(x, weight, bias, scale)
    count, mean, biased_var = global_moments(y, process_group)
    mean, invstd = _move_running_statistics(y, count, mean, biased_var, running_mean, running_var,
                                            num_batches_tracked, momentum, eps)  # fmt: skip
    count = count.to(statistics_dtype(y.dtype))
    return _SynchronizedNormalization.apply(y, gamma, beta, mean, invstd, count, process_group)


def _move_running_statistics(
    y: Tensor, count: Tensor, mean: Tensor, biased_var: Tensor, running_mean: Tensor | None,
    running_var: Tensor | None, num_batches_tracked: Tensor | None, momentum: float | None, eps: float,
    count_batch: bool = True,
) -> tuple[Tensor, Tensor]:
    """The PyTorch route's use of the global statistics (float64 [N] each): the batch counted (when
    num_batches_tracked is given and the batch not counted yet), the running statistics moved; (mean, invstd) in the
    statistics dtype."""
    math = statistics_dtype(y.dtype)
    with torch.no_grad():
        if num_batches_tracked is not None and count_batch:
            num_batches_tracked.add_(1)
        if running_mean is not None and running_var is not None:
            _update_running_stats(running_mean, running_var, num_batches_tracked, momentum,
                                  mean.to(running_mean.dtype), biased_var.to(running_var.dtype), count)  # fmt: skip
    return mean.to(math), torch.rsqrt(biased_var + eps).to(math)


def convert_sync_batchnorm(module: nn.Module, process_group=None) -> nn.Module:
    """nn.SyncBatchNorm.convert_sync_batchnorm's analogue: every GemmScaleBatchNorm in module (itself included)
    synchronizes its batch statistics over process_group (None: the default group), and every ReferenceModel
    becomes such a GemmScaleBatchNorm sharing its parameters and buffers. Returns the converted module."""
    from .modules import GemmScaleBatchNorm  # modules imports functional, which imports this file
    from .reference import ReferenceModel

    group = dist.group.WORLD if process_group is None else process_group
    if isinstance(module, ReferenceModel):
        module = GemmScaleBatchNorm.from_module(module)
    if isinstance(module, GemmScaleBatchNorm):
        module.process_group = group
        return module
    for name, child in module.named_children():
        setattr(module, name, convert_sync_batchnorm(child, process_group))
    return module
