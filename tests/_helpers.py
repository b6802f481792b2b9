"""Test helpers: paired models, state snapshots, float64 gradients and comparison tolerances."""

from __future__ import annotations

import copy

import torch
from torch import nn

from gemmbn import GemmScaleBatchNorm, ReferenceModel

# CPU fallback vs nn.Linear + nn.BatchNorm1d in the same dtype: the outputs are the same PyTorch ops;
# the running statistics are updated by a separate (manual) formula, so they differ by a few ulps.
SAME_OPS = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-12, atol=1e-12)}
# Gradients by gemmbn's hand-written backward (or a compiler's rewrite of it) vs PyTorch autograd.
# float64: both exact to ~1e-15; the bound only absorbs different summation orders. float32: the same
# math in another order; some gradients are near-cancellations (the bias gradient is ~0 in training,
# since BN removes the mean), so an absolute floor of a few float32 ulps of the summed terms.
GRAD_TOLERANCE = {torch.float64: dict(rtol=1e-10, atol=1e-12), torch.float32: dict(rtol=2e-4, atol=2e-5)}


def reference_copy(module: nn.Module) -> ReferenceModel:
    """A ReferenceModel (nn.Linear, scale, nn.BatchNorm1d) holding copies of module's gemm, scale and bn."""
    reference = ReferenceModel(1, 1, (1,))
    reference.gemm, reference.scale, reference.bn = (copy.deepcopy(getattr(module, n)) for n in ("gemm", "scale", "bn"))
    reference.training = module.training  # without recursing: bn keeps its own (copied) mode
    return reference


def make_pair(in_features=24, out_features=16, scale_shape=None, *, seed=0, dtype=None, device=None, **kwargs):
    """(reference, drop_in): a seeded GemmScaleBatchNorm and a reference_copy of it.

    The reference computes bn(gemm(x) * scale) with nn.Linear and nn.BatchNorm1d, whatever the
    options (bias, affine, track_running_stats, momentum, eps) of the drop-in.
    """
    scale_shape = (out_features,) if scale_shape is None else scale_shape
    torch.manual_seed(seed)
    drop_in = GemmScaleBatchNorm(in_features, out_features, scale_shape, device=device, dtype=dtype, **kwargs)
    return reference_copy(drop_in), drop_in


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of every parameter and buffer (by state_dict key)."""
    return {key: value.detach().clone() for key, value in module.state_dict().items()}


def assert_state_equal(module: nn.Module, expected: dict[str, torch.Tensor], **tolerance) -> None:
    """module's parameters and buffers equal ``expected`` (exactly unless tolerances are given)."""
    state = module.state_dict()
    assert state.keys() == expected.keys()
    for key, value in expected.items():
        if tolerance and value.is_floating_point():
            torch.testing.assert_close(state[key], value, **tolerance, msg=lambda m, key=key: f"{key}: {m}")
        else:
            assert torch.equal(state[key], value), f"{key} changed"


def grads(module: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Gradients by parameter name (plus 'x') of module(x) under the fixed cotangent ``cotangent(out)``."""
    module.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    out = module(x)
    out.backward(cotangent(out))
    # (A torch.compile'd module names its parameters "_orig_mod.<name>".)
    result = {name.removeprefix("_orig_mod."): p.grad for name, p in module.named_parameters() if p.grad is not None}
    result["x"] = x.grad
    return result


def cotangent(out: torch.Tensor) -> torch.Tensor:
    """A fixed, non-trivial dL/dout: not constant per column (a constant would make BN's gradient vanish)."""
    generator = torch.Generator(device="cpu").manual_seed(1234)
    return torch.randn(out.shape, generator=generator, dtype=torch.float64).to(out.device, out.dtype)


def float64_grads(module: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """grads() of bn(gemm(x) * scale) computed in float64 with nn modules, on copies of module's state."""
    return grads(reference_copy(module).double(), x.double())
