"""Gradients of the drop-in (hand-written backward) against PyTorch autograd of the reference."""

import pytest
import torch
from _helpers import GRAD_TOLERANCE, SAME_OPS, grads, make_pair

from gemmbn import backward, linear_scale_batch_norm

M, K, N = 32, 24, 16

OPTIONS = {
    "default": {},
    "affine_off": {"affine": False},
    "no_bias": {"bias": False},
    "no_bn_bias": {},  # bn.bias removed below: gamma without beta
    "tracking_off": {"track_running_stats": False},
    "scale_shape_1": {"scale_shape": (1,)},
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("option", OPTIONS.keys())
def test_gradients_match_pytorch(dtype, training, option):
    reference, drop_in = make_pair(K, N, dtype=dtype, **OPTIONS[option])
    for module in (reference, drop_in):
        if option == "no_bn_bias":
            module.bn.bias = None
        if module.bn.track_running_stats:  # eval mode then normalizes with non-trivial statistics
            with torch.no_grad():
                module.bn.running_mean.copy_(torch.linspace(-1, 1, N, dtype=dtype))
                module.bn.running_var.copy_(torch.linspace(0.5, 2, N, dtype=dtype))
        module.train(training)
    x = torch.rand(M, K, dtype=dtype) * 2 - 0.5
    expected, actual = grads(reference, x), grads(drop_in, x)
    assert actual.keys() == expected.keys()
    for name, grad in expected.items():
        assert actual[name].shape == grad.shape and actual[name].dtype == grad.dtype
        torch.testing.assert_close(actual[name], grad, **GRAD_TOLERANCE[dtype], msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_gradcheck_functional(training):
    """Finite differences in float64 (train: batch statistics; eval: fixed running statistics)."""
    torch.manual_seed(0)
    x, weight, bias, scale, gamma, beta = (
        t.double().requires_grad_() for t in (torch.rand(6, 4), torch.randn(3, 4), torch.randn(3), torch.randn(3),
                                              torch.randn(3), torch.randn(3))
    )  # fmt: skip
    running_mean, running_var = torch.randn(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.5

    def f(x, weight, bias, scale, gamma, beta):
        return linear_scale_batch_norm(
            x, weight, bias, scale, gamma, beta, running_mean, running_var, None, training, 0.1, 1e-5
        )

    assert torch.autograd.gradcheck(f, (x, weight, bias, scale, gamma, beta))


def test_train_backward_recomputes_missing_pre_norm():
    torch.manual_seed(0)
    x, weight, bias, scale, gamma, beta = torch.rand(M, K), torch.randn(N, K), *torch.randn(4, N)
    y = torch.nn.functional.linear(x, weight, bias) * scale
    var, mean = torch.var_mean(y, dim=0, correction=0)
    invstd = torch.rsqrt(var + 1e-5)
    dout = torch.randn(M, N)
    needs = [True] * 6

    def grads(pre_norm, needs):
        return backward.linear_scale_bn_backward(
            dout, x, weight, bias, scale, gamma, beta, pre_norm, mean, invstd, True, needs, "highest"
        )

    kept, recomputed = grads(y, needs), grads(y.new_empty(0), needs)
    for a, b in zip(kept, recomputed):
        torch.testing.assert_close(a, b)
    only_x = grads(y, [True] + [False] * 5)
    assert only_x[1:] == (None,) * 5
    torch.testing.assert_close(only_x[0], kept[0])
    only_beta = grads(y.new_empty(0), [False] * 5 + [True])
    assert only_beta[:5] == (None,) * 5
    torch.testing.assert_close(only_beta[5], dout.sum(0))


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_double_backward_is_refused(training):
    _, drop_in = make_pair(K, N)
    drop_in.train(training)
    x = torch.rand(M, K, requires_grad=True)
    out = drop_in(x)
    with pytest.raises(RuntimeError, match="double backward .* not supported"):
        torch.autograd.grad(out, x, torch.randn_like(out), create_graph=True)


@pytest.mark.parametrize(("trainable", "kept"), [("all", 1), ("beta", 0)])
def test_forward_keeps_one_activation(trainable, kept):
    """The training forward saves x, W and one M x N tensor (y) for the backward, and no y when only beta
    trains (its gradient is sum dout): then the finish normalizes in place."""
    _, drop_in = make_pair(K, N)
    if trainable == "beta":
        for name, p in drop_in.named_parameters():
            p.requires_grad_(name == "bn.bias")
    x = torch.rand(M, K, requires_grad=trainable == "all")
    out = drop_in(x)
    saved = [t for t in out.grad_fn.saved_tensors if t is not None]
    assert sum(t.shape == (M, N) for t in saved) == kept
    out.backward(torch.randn_like(out))
    assert drop_in.bn.bias.grad is not None


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_native_first_records_the_graph(monkeypatch, training):
    """The module's native-first call (ops._apply_eager: autograd's C++ apply without Function.apply's Python
    wrapper) records the same graph as the public apply: on the CPU, with the native operators replaced by the
    reference (same arguments and results), the output, running statistics and every gradient match nn's modules,
    and each forward went through the C++ apply once."""
    from gemmbn import fused, ops, reference

    def train_operator(x, weight, bias, scale, gamma, beta, rm, rv, nbt, momentum, eps, split, unscale, keep):
        with torch.no_grad():  # the real operator's results carry no autograd history either
            return reference.linear_scale_batch_norm(
                x, weight, bias, scale, gamma, beta, rm, rv, nbt, True, momentum, eps, keep_pre_norm=keep
            )

    def eval_forward(x, weight, bias, scale, gamma, beta, rm, rv, eps, gemm_kind):
        with torch.no_grad():
            return reference.linear_scale_batch_norm(x, weight, bias, scale, gamma, beta, rm, rv, None, False, None, eps)[0]

    monkeypatch.setattr(ops, "fused_unavailable_reason", lambda x: None)
    monkeypatch.setattr(fused, "operator", lambda name: {"train_forward": train_operator}[name])
    monkeypatch.setattr(fused, "eval_forward", eval_forward)
    monkeypatch.setattr(backward, "FUSED", False)  # the reference backward: the graph is what is under test
    applied = []
    for function, apply in list(ops._CPP_APPLY.items()):
        monkeypatch.setitem(ops._CPP_APPLY, function, lambda *a, f=function, apply=apply: applied.append(f) or apply(*a))
    reference_module, drop_in = make_pair(K, N, dtype=torch.float32, precision="high")
    for module in (reference_module, drop_in):
        module.train(training)
        with torch.no_grad():  # non-trivial running statistics for eval mode
            module.bn.running_mean.copy_(torch.linspace(-1, 1, N))
            module.bn.running_var.copy_(torch.linspace(0.5, 2, N))
    x = torch.rand(M, K) * 2 - 0.5
    expected, actual = grads(reference_module, x), grads(drop_in, x)
    assert applied == [ops._TrainFunction if training else ops._EvalFunction]
    with torch.no_grad():
        torch.testing.assert_close(drop_in(x), reference_module(x), **SAME_OPS[torch.float32])
    assert applied == [ops._TrainFunction if training else ops._EvalFunction]  # no graph, no apply
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(drop_in.bn, name), getattr(reference_module.bn, name), **SAME_OPS[torch.float32])
    assert actual.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(actual[name], grad, **GRAD_TOLERANCE[torch.float32], msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["tf32_route", "bf16_route"])
def test_fused_route_gemms_run_at_the_route_precision(monkeypatch, dtype):
    """The fused backward's two torch GEMMs (backward._fused_grads, the kernel replaced by given results):
    dx = dz W and dW = dz^T x against float64; the TF32 route runs them with PyTorch's TF32 switch on and restores
    the caller's "highest" after; 16-bit ones leave the setting alone."""
    from gemmbn import fused, precision

    route = precision.TF32 if dtype == torch.float32 else precision.NATIVE_16BIT
    x, weight = torch.randn(M, K).to(dtype), torch.randn(N, K).to(dtype)
    dz = torch.randn(M, N).to(dtype)
    column = torch.randn(N)
    kernel_results = (dz, column, column + 1, column + 2, column + 3, ())  # dz, dgamma, dbeta, db, ds, no transposes
    monkeypatch.setattr(fused, "batch_norm_backward", lambda *args: kernel_results)
    seen = []
    matmul = torch.Tensor.__matmul__
    monkeypatch.setattr(torch.Tensor, "__matmul__", lambda a, b: seen.append(precision.current()) or matmul(a, b))
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        dx, dW, db, ds, dgamma, dbeta = backward._fused_grads(
            route, torch.randn(M, N).to(dtype), x, weight, column, column, column, dz, column, column, True, [True] * 6
        )  # fmt: skip
        after = precision.current()
    finally:
        torch.set_float32_matmul_precision(previous)
    assert seen == (["high", "high"] if route == precision.TF32 else ["highest", "highest"])
    assert after == "highest"
    assert (db, ds, dgamma, dbeta) == kernel_results[3:5] + kernel_results[1:3]
    # float32: a CPU GEMM (TF32 does not apply there) of K or M terms, float32 accumulation; bf16: one rounding of the
    # output to bf16 (2^-8 relative) on top of that.
    bound = 1e-5 if dtype == torch.float32 else 2**-7
    for got, want in ((dx, dz.double() @ weight.double()), (dW, dz.double().t() @ x.double())):
        torch.testing.assert_close(got.double(), want, rtol=bound, atol=bound * want.abs().max().item())
