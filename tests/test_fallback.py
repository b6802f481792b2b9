"""The fallback: one warning per reason, naming it; the plan's reasons for every unsupported case."""

import warnings

import pytest
import torch
from _helpers import make_pair

from gemmbn import GemmBnFallbackWarning, _native, fallback, fused_unavailable_reason, linear_scale_batch_norm, plan
from gemmbn.plan import layout_reason

K, N = 24, 16


def _fallback_warnings(fn):
    """Run fn, returning the GemmBnFallbackWarnings it issued (whatever the active filters)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [w for w in caught if issubclass(w.category, GemmBnFallbackWarning)]


@pytest.mark.parametrize("training", [True, False])
def test_warns_once_naming_the_reason(training):
    _, drop_in = make_pair(K, N)
    drop_in.train(training)
    x = torch.rand(8, K)
    first = _fallback_warnings(lambda: drop_in(x))
    assert len(first) == 1
    assert "x is on cpu; the fused kernels need an sm90 (Hopper) GPU" in str(first[0].message)
    assert _fallback_warnings(lambda: drop_in(x)) == []  # second call: silent


@pytest.mark.parametrize("call", ["module", "functional", "backward"])
def test_warning_points_at_the_callers_line(call):
    """The warning names the user's line that called into gemmbn, not gemmbn's or torch's own code."""
    _, drop_in = make_pair(K, N)
    x = torch.rand(8, K, requires_grad=True)
    if call == "backward":  # the backward's own reason: the forward's warning is used up first
        out = drop_in(x)
        fallback.reset()
        caught = _fallback_warnings(lambda: out.sum().backward())
    elif call == "functional":
        caught = _fallback_warnings(lambda: linear_scale_batch_norm(
            x, drop_in.gemm.weight, drop_in.gemm.bias, drop_in.scale, drop_in.bn.weight, drop_in.bn.bias,
            None, None, None, True, 0.1, 1e-5))  # fmt: skip
    else:
        caught = _fallback_warnings(lambda: drop_in(x))
    assert len(caught) == 1
    assert caught[0].filename == __file__, (caught[0].filename, caught[0].lineno)


def test_each_reason_warns_once():
    reasons = ["K=1001 is not a multiple of 4", "x is on cpu", "K=1001 is not a multiple of 4"]
    issued = _fallback_warnings(lambda: [fallback.warn_once(reason) for reason in reasons])
    assert [str(w.message).rsplit(": ", 1)[-1] for w in issued] == reasons[:2]


def test_cpu_tensor_reason():
    assert fused_unavailable_reason(torch.rand(2, 2)) == "x is on cpu; the fused kernels need an sm90 (Hopper) GPU"


def test_missing_build_is_reported():
    reason = _native.load_operators()
    if reason is None:
        pytest.skip("the operators are built here")
    assert "_operators.so" in reason
    with pytest.raises(RuntimeError, match="_operators.so"):
        _native.operators()


def _vectors(n=N, dtype=torch.float32, **overrides):
    vectors = {name: torch.randn(n, dtype=dtype) for name in ("bias", "scale", "gamma", "beta", "running_mean")}
    vectors["running_var"] = torch.rand(n, dtype=dtype) + 0.5
    vectors.update(overrides)
    return vectors


def _misaligned(rows, cols):
    """A contiguous [rows, cols] float32 view whose data pointer is 4 bytes past a 16-byte boundary."""
    return torch.randn(rows * cols + 1)[1:].view(rows, cols)


LAYOUTS = {
    "fp32_ok": (torch.float32, 40, 512, 260, {}, None),
    "bf16_ok": (torch.bfloat16, 40, 512, 264, {}, None),
    "float64": (torch.float64, 40, 512, 260, {}, "dtype torch.float64 has no fused kernel"),
    "k_not_multiple": (torch.float32, 40, 1001, 260, {}, "K=1001 is not a multiple of 4 (TMA needs 16-byte rows"),
    "n_not_multiple_16bit": (torch.bfloat16, 40, 512, 260, {}, "N=260 is not a multiple of 8"),
    "scale_dtype": (torch.float32, 40, 512, 260, {"scale": torch.randn(260, dtype=torch.bfloat16)},
                    "scale is torch.bfloat16 but x is torch.float32"),
    "running_var_dtype": (torch.bfloat16, 40, 512, 264, {"running_var": torch.rand(264)},
                          "running_var is torch.float32 but x is torch.bfloat16"),
    "running_mean_strided": (torch.float32, 40, 512, 260, {"running_mean": torch.randn(520)[::2]},
                             "running_mean is not contiguous"),
    "empty_batch": (torch.float32, 0, 512, 260, {}, "M=0 is outside [1, 2**31)"),
}  # fmt: skip


@pytest.mark.parametrize(("dtype", "M", "K_", "N_", "overrides", "expected"), LAYOUTS.values(), ids=LAYOUTS.keys())
def test_layout_reasons(dtype, M, K_, N_, overrides, expected):
    x = torch.randn(M, K_).to(dtype)
    weight = torch.randn(N_, K_).to(dtype)
    reason = layout_reason(x, weight, _vectors(N_, dtype, **overrides), eps=1e-5, batches_tracked=torch.tensor(0))
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason


def test_layout_reason_alignment_eps_and_counter(monkeypatch):
    weight, vectors = torch.randn(260, 512), _vectors(260)
    # Operands the kernels only read may be views of any layout (the operators copy them into theirs) ...
    strided_vectors = _vectors(260, bias=torch.randn(520)[::2], scale=_misaligned(1, 260)[0])
    assert layout_reason(_misaligned(40, 512), weight.t().contiguous().t(), strided_vectors, 1e-5) is None
    # ... the running statistics, updated in place, may not (fused_plan checks their addresses, past the device).
    monkeypatch.setattr(plan, "fused_unavailable_reason", lambda x: None)
    assert plan.fused_plan(_misaligned(40, 512), weight, vectors, 1e-5) is None
    offset_mean = _vectors(260, running_mean=_misaligned(1, 260)[0])
    assert "running_mean's data pointer is not 16-byte aligned" in plan.fused_plan(torch.randn(40, 512), weight,
                                                                                    offset_mean, 1e-5)
    assert "eps=0.0 is not positive" in layout_reason(torch.randn(40, 512), weight, vectors, 0.0)
    int32_counter = torch.tensor(0, dtype=torch.int32)
    assert "int64" in layout_reason(torch.randn(40, 512), weight, vectors, 1e-5, int32_counter)
