"""The eval forward's folded affine kept across calls (gemmbn.eval_fold_cache): a repeated call reuses it, and any
change to what it was folded from (an in-place update, an optimizer step, a training forward's running statistics,
load_state_dict, a replaced parameter, another eps) folds again, so the module's eval output is always bitwise the
uncached operator's (gemmbn::eval_forward, fold included) on the tensors as they are then. Where nothing can be cached
(inference tensors, CUDA graph capture) every call folds. Outputs are poisoned before the forwards write them.
"""

from __future__ import annotations

import pytest
import torch
from conftest import requires_sm90
from torch import nn

from _gpu import CONFIGS, DEVICE, fused_path, model, poison_next_allocation, rand_x, require_extension

from gemmbn import eval_fold_cache, linear_scale_batch_norm, reference, weight_cache
from gemmbn._native import operators

pytestmark = [pytest.mark.gpu, requires_sm90]

CASES = ["fp32-highest", "fp32-high", "bf16"]
M, K, N = 256, 512, 384


@pytest.fixture(scope="module", autouse=True)
def _built():
    require_extension()


@pytest.fixture(autouse=True)
def _fresh_cache():
    eval_fold_cache.clear()
    yield
    eval_fold_cache.clear()


def _eval_layer(config: str):
    dtype, precision = CONFIGS[config]
    layer = model(dtype, precision, K, N, seed=3)
    with torch.no_grad():  # running statistics and affine parameters away from (0, 1), so that the fold shows
        layer.bn.running_mean.normal_()
        layer.bn.running_var.uniform_(0.5, 2.0)
        layer.bn.weight.uniform_(0.5, 1.5)
        layer.bn.bias.normal_()
    return layer.eval(), rand_x(M, K, dtype)


def _uncached(layer, x) -> torch.Tensor:
    """The eval_forward operator on the layer's tensors as they are now: the fold made inside the call."""
    w, bn = layer.gemm.weight, layer.bn
    split = weight_cache.split_now(w) if w.dtype == torch.float32 and layer.precision == "highest" else (None, None)
    with torch.no_grad():
        return operators().eval_forward(x, w, layer.gemm.bias, layer.scale, bn.weight, bn.bias, bn.running_mean,
                                        bn.running_var, bn.eps, *split)  # fmt: skip


def _forward(layer, x) -> torch.Tensor:
    poison_next_allocation((M, N), x.dtype)
    with fused_path(), torch.no_grad():
        return layer(x)


def _cached_affine(layer, x):
    bn = layer.bn
    return eval_fold_cache.affine(x, layer.gemm.weight, layer.gemm.bias, layer.scale, bn.weight, bn.bias,
                                  bn.running_mean, bn.running_var, bn.eps)  # fmt: skip


@pytest.mark.parametrize("config", CASES)
def test_a_repeated_eval_forward_reuses_the_fold(config):
    layer, x = _eval_layer(config)
    first = _forward(layer, x)
    affine = _cached_affine(layer, x)
    second = _forward(layer, x)
    assert _cached_affine(layer, x) is affine  # the second forward found the first one's fold
    expected = _uncached(layer, x)
    torch.cuda.synchronize()
    assert not first.isnan().any()
    assert torch.equal(first, expected) and torch.equal(second, expected)
    # And against float64 (the eval forward's math, reference.py): the GEMM's own rounding bounds the error
    # (TF32 and bf16 operands; the split GEMM keeps ~22 bits), the fold is exact to fp32.
    with torch.no_grad():
        bn = layer.bn
        exact, _, _, _ = reference.linear_scale_batch_norm(
            *(t.double() for t in (x, layer.gemm.weight, layer.gemm.bias, layer.scale, bn.weight, bn.bias,
                                   bn.running_mean, bn.running_var)), None, False, None, bn.eps)  # fmt: skip
    tolerance = {"fp32-highest": 1e-5, "fp32-high": 3e-3, "bf16": 2e-2}[config]  # relative Frobenius, as above
    assert ((first.double() - exact).norm() / exact.norm()).item() < tolerance


def _step_in_place(layer, x):
    with torch.no_grad():
        layer.bn.weight.mul_(1.5)


def _optimizer_step(layer, x):
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    for p in layer.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()


def _training_forward(layer, x):  # moves the running statistics (the kernels' in-place update)
    layer.train()
    with fused_path(), torch.no_grad():
        layer(rand_x(M, K, x.dtype) * 3)
    layer.eval()


def _load_state_dict(layer, x):
    state = {name: t.clone() for name, t in layer.state_dict().items()}
    state["bn.running_var"] = state["bn.running_var"] * 2
    layer.load_state_dict(state)


def _replace_bias(layer, x):
    layer.gemm.bias = nn.Parameter(torch.randn_like(layer.gemm.bias))


def _change_eps(layer, x):
    layer.bn.eps = 0.5


CHANGES = [_step_in_place, _optimizer_step, _training_forward, _load_state_dict, _replace_bias, _change_eps]


@pytest.mark.parametrize("change", CHANGES, ids=lambda f: f.__name__.lstrip("_"))
@pytest.mark.parametrize("config", CASES)
def test_every_change_to_a_folded_input_folds_again(config, change):
    layer, x = _eval_layer(config)
    before = _forward(layer, x)
    change(layer, x)
    after = _forward(layer, x)
    expected = _uncached(layer, x)
    torch.cuda.synchronize()
    assert not torch.equal(after, before)  # the change moved the output ...
    assert torch.equal(after, expected)  # ... to what the uncached operator gives now


def test_writes_through_data_need_clear():
    # .data bypasses the version counter (as it bypasses autograd): the documented contract is clear().
    layer, x = _eval_layer("bf16")
    before = _forward(layer, x)
    layer.bn.running_mean.data.add_(1.0)
    stale = _forward(layer, x)
    eval_fold_cache.clear()
    fresh = _forward(layer, x)
    expected = _uncached(layer, x)
    torch.cuda.synchronize()
    assert torch.equal(stale, before)
    assert torch.equal(fresh, expected) and not torch.equal(fresh, before)


def test_inference_tensors_fold_every_call():
    layer, x = _eval_layer("bf16")
    w, b, s, bn = layer.gemm.weight, layer.gemm.bias, layer.scale, layer.bn
    with torch.inference_mode():
        # Made here, the running statistics are inference tensors: no version counter, so nothing is cached.
        running_mean, running_var = bn.running_mean.clone(), bn.running_var.clone()
        args = (x, w, b, s, bn.weight, bn.bias, running_mean, running_var)
        assert eval_fold_cache.affine(*args, bn.eps) is None
        with fused_path():
            first = linear_scale_batch_norm(*args, None, False, bn.momentum, bn.eps)
            running_mean.add_(1.0)
            second = linear_scale_batch_norm(*args, None, False, bn.momentum, bn.eps)
        expected = operators().eval_forward(*args, bn.eps, None, None)
    torch.cuda.synchronize()
    assert not torch.equal(first, second) and torch.equal(second, expected)


def test_a_captured_forward_folds_on_every_replay():
    layer, x = _eval_layer("bf16")
    _forward(layer, x)  # a cached fold exists, and must not be what the graph captures
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.no_grad(), fused_path():
        layer(x)  # warm-up on the capture stream
        with torch.cuda.graph(graph, stream=stream):
            captured = layer(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    before = captured.clone()
    with torch.no_grad():
        layer.bn.weight.mul_(2.0)
    graph.replay()
    expected = _uncached(layer, x)
    torch.cuda.synchronize()
    assert not torch.equal(captured, before) and torch.equal(captured, expected)
