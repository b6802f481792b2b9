"""GemmScaleBatchNorm: a drop-in for BatchNorm1d(Linear(x) * scale) running the fused kernels."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from . import precision as precision_mod
from ._native import Refused
from .functional import linear_scale_batch_norm, native_first


def _member(module: nn.Module, name: str):
    """module.<name> (a parameter, buffer or submodule) read from nn.Module's own tables, else the usual lookup (a
    parametrized weight is a property, say)."""
    for table in (module._parameters, module._buffers, module._modules):
        if name in table:
            return table[name]
    return getattr(module, name)


def _operands(module: GemmScaleBatchNorm) -> tuple:
    """(gemm, bn, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked) of the module.

    Read from nn.Module's tables: nn.Module.__getattr__ costs ~0.7 us a lookup and a forward makes eleven, while
    the GPU waits for the launch at small shapes. A name missing from the expected table (a parametrized weight,
    a scale kept as a buffer) takes _member's general route.
    """
    try:
        modules = module._modules
        gemm, bn = modules["gemm"], modules["bn"]
        linear, affine, buffers = gemm._parameters, bn._parameters, bn._buffers
        return (gemm, bn, linear["weight"], linear["bias"], module._parameters["scale"], affine["weight"],
                affine["bias"], buffers["running_mean"], buffers["running_var"], buffers["num_batches_tracked"])  # fmt: skip
    except KeyError:
        gemm, bn = _member(module, "gemm"), _member(module, "bn")
        names = ((gemm, "weight"), (gemm, "bias"), (module, "scale"), (bn, "weight"), (bn, "bias"),
                 (bn, "running_mean"), (bn, "running_var"), (bn, "num_batches_tracked"))  # fmt: skip
        return (gemm, bn, *(_member(owner, name) for owner, name in names))


class GemmScaleBatchNorm(nn.Module):
    """out = BatchNorm1d(Linear(x) * scale), with nn.BatchNorm1d's training/eval semantics.

    Parameters and buffers carry the reference model's names (``gemm``, ``scale``, ``bn``) and are
    created in the same order, so one seed gives identical parameters and state_dicts load both ways.
    ``precision`` ("highest", "high", "medium" or None = follow torch.get_float32_matmul_precision())
    picks the float32 GEMM; bf16/fp16 always run the native kernels. ``process_group`` (a torch.distributed
    group; None: none) makes the batch statistics those of every rank's rows, as nn.SyncBatchNorm
    (gemmbn.convert_sync_batchnorm sets it on a model's layers).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        scale_shape,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        *,
        bias: bool = True,
        affine: bool = True,
        track_running_stats: bool = True,
        precision: str | None = None,
        process_group=None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.precision = None if precision is None else precision_mod.validate(precision)
        self.process_group = process_group
        # Same construction order as the reference Model: Linear, then scale, then BatchNorm1d.
        self.gemm = nn.Linear(in_features, out_features, bias=bias, **factory)
        self.scale = nn.Parameter(torch.randn(scale_shape, **factory))
        self.bn = nn.BatchNorm1d(
            out_features, eps=eps, momentum=momentum, affine=affine, track_running_stats=track_running_stats, **factory
        )

    @classmethod
    def from_module(cls, model: nn.Module, precision: str | None = None) -> GemmScaleBatchNorm:
        """A GemmScaleBatchNorm sharing ``model``'s gemm (nn.Linear), scale and bn (nn.BatchNorm1d): no copies."""
        gemm, scale, bn = (getattr(model, name, None) for name in ("gemm", "scale", "bn"))
        if not isinstance(gemm, nn.Linear) or not isinstance(bn, nn.BatchNorm1d) or not isinstance(scale, Tensor):
            raise TypeError(
                "from_module expects a model with gemm (nn.Linear), scale (Tensor) and bn (nn.BatchNorm1d), "
                f"got {type(model).__name__}"
            )
        if gemm.out_features != bn.num_features:
            raise ValueError(f"gemm has {gemm.out_features} output features but bn normalizes {bn.num_features}")
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.precision = None if precision is None else precision_mod.validate(precision)
        module.process_group = None
        module.gemm, module.bn = gemm, bn
        if isinstance(scale, nn.Parameter):
            module.scale = scale
        else:
            module.register_buffer("scale", scale)  # a plain tensor stays a buffer, keeping state_dict keys
        module.training = model.training
        return module

    def forward(self, x: Tensor) -> Tensor:
        """out = bn(gemm(x) * scale), reading bn's current mode, momentum, eps and buffers like nn.BatchNorm1d."""
        gemm, bn, weight, bias, scale, gamma, beta, running_mean, running_var, num_batches_tracked = _operands(self)
        training = bn.training
        # nn.BatchNorm1d passes its buffers unless training without tracking.
        use_buffers = not training or bn.track_running_stats
        args = (
            x, weight, bias, scale, gamma, beta,
            running_mean if use_buffers else None,
            running_var if use_buffers else None,
            num_batches_tracked if training and bn.track_running_stats else None,
            training, bn.momentum, bn.eps, self.precision,
        )  # fmt: skip
        # Eager calls go straight to the operator, which checks them (functional.native_first); traced ones
        # (torch.compile, export) and refused ones (a CPU tensor, say) take the validated route.
        if self.process_group is None and isinstance(x, Tensor) and not torch.compiler.is_compiling():
            try:
                return native_first(*args)
            except Refused:
                pass
        return linear_scale_batch_norm(*args, self.process_group)

    def __deepcopy__(self, memo):
        """A copy with its own parameters and buffers that shares the process group (a group cannot be copied:
        copying a model for an EMA or a reference would fail otherwise)."""
        if self.process_group is not None:
            memo.setdefault(id(self.process_group), self.process_group)
        clone = self.__class__.__new__(self.__class__)
        memo[id(self)] = clone
        clone.__setstate__(copy.deepcopy(self.__dict__, memo))
        return clone

    def extra_repr(self) -> str:
        follow = " (follows torch.get_float32_matmul_precision())" if self.precision is None else ""
        synchronized = "" if self.process_group is None else ", synchronized over a process group"
        return f"precision={self.precision!r}{follow}{synchronized}"
