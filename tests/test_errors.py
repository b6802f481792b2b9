"""Bad arguments raise clear errors before anything runs: parameters and running statistics stay put."""

import re

import pytest
import torch
from _helpers import assert_state_equal, make_pair, snapshot

from gemmbn import GemmScaleBatchNorm, linear_scale_batch_norm

K, N = 24, 16
ONE_ROW_MESSAGE = f"Expected more than 1 value per channel when training, got input size {torch.Size([1, N])}"

BAD_INPUTS = {
    "float64_x_float32_model": (lambda: torch.rand(8, K, dtype=torch.float64), TypeError,
                                "weight is torch.float32 but x is torch.float64"),
    "integer_x": (lambda: torch.randint(0, 4, (8, K)), TypeError, "floating-point"),
    "x_on_other_device": (lambda: torch.rand(8, K, device="meta"), ValueError, "weight is on cpu but x is on meta"),
    "x_3d": (lambda: torch.rand(2, 8, K), ValueError, "x must be 2-D"),
    "x_1d": (lambda: torch.rand(K), ValueError, "x must be 2-D"),
    "in_features_mismatch": (lambda: torch.rand(8, K - 1), ValueError,
                             "in_features mismatch: x has 23 features, weight expects 24"),
    "one_row_in_training": (lambda: torch.rand(1, K), ValueError, re.escape(ONE_ROW_MESSAGE)),
}  # fmt: skip


@pytest.mark.parametrize(("make_x", "error", "match"), BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_bad_input_raises_and_mutates_nothing(make_x, error, match):
    _, drop_in = make_pair(K, N)
    drop_in(torch.rand(8, K))  # non-trivial running statistics
    before = snapshot(drop_in)
    with pytest.raises(error, match=match):
        drop_in(make_x())
    assert_state_equal(drop_in, before)


@pytest.mark.parametrize("make_x", [bad[0] for bad in BAD_INPUTS.values()], ids=BAD_INPUTS.keys())
def test_errors_are_of_the_references_types(make_x):
    """Code that catches what the reference model raises (mostly nn.Linear's RuntimeErrors) catches ours: each of
    gemmbn's errors is an instance of the reference's exception type for the same input."""
    reference, drop_in = make_pair(K, N)
    x = make_x()
    with pytest.raises(Exception) as expected:
        reference(x)
    with pytest.raises(Exception) as actual:
        drop_in(x)
    assert isinstance(actual.value, type(expected.value)), (type(actual.value), type(expected.value))


def test_one_row_message_is_pytorchs():
    reference, drop_in = make_pair(K, N)
    x = torch.rand(1, K)
    with pytest.raises(ValueError) as expected:
        reference(x)
    before = snapshot(drop_in)
    with pytest.raises(ValueError) as actual:
        drop_in(x)
    assert str(actual.value) == str(expected.value)
    # Deliberate difference: nn.BatchNorm1d counts the batch before raising; gemmbn raises first.
    assert reference.bn.num_batches_tracked.item() == 1
    assert_state_equal(drop_in, before)


def _functional_args():
    torch.manual_seed(0)
    return {
        "x": torch.rand(8, K),
        "weight": torch.randn(N, K),
        "bias": torch.randn(N),
        "scale": torch.randn(N),
        "gamma": torch.randn(N),
        "beta": torch.randn(N),
        "running_mean": torch.randn(N),
        "running_var": torch.rand(N) + 0.5,
        "num_batches_tracked": torch.tensor(3),
        "training": True,
        "momentum": 0.1,
        "eps": 1e-5,
    }


BAD_ARGUMENTS = {
    "running_var_without_mean": ({"running_var": None}, ValueError, "running_mean and running_var must be given"),
    "gamma_wrong_length": ({"gamma": torch.randn(N + 1)}, ValueError, r"gamma must have shape \(16,\)"),
    "bias_wrong_dtype": ({"bias": torch.randn(N, dtype=torch.float64)}, TypeError, "bias is torch.float64"),
    "scale_per_row": ({"scale": torch.randn(8, N)}, ValueError, "does not broadcast"),
    "scale_wrong_length": ({"scale": torch.randn(N - 1)}, ValueError, "does not broadcast"),
    "float_batch_counter": ({"num_batches_tracked": torch.tensor(3.0)}, ValueError, "num_batches_tracked"),
    "eps_zero_training": ({"eps": 0.0}, ValueError, "eps must be positive during training"),
    "eps_negative_eval": ({"eps": -1.0, "training": False}, ValueError, "eps must be non-negative"),
    "unknown_precision": ({"precision": "low"}, ValueError, "precision must be one of"),
    "weight_not_tensor": ({"weight": [[1.0]]}, TypeError, "weight must be a Tensor"),
}  # fmt: skip


@pytest.mark.parametrize(("change", "error", "match"), BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_functional_bad_argument_raises_and_mutates_nothing(change, error, match):
    args = _functional_args()
    args.update(change)
    before = {name: v.clone() for name, v in args.items() if isinstance(v, torch.Tensor)}
    with pytest.raises(error, match=match):
        linear_scale_batch_norm(**args)
    for name, value in before.items():
        assert torch.equal(args[name], value), f"{name} changed"


def test_module_rejects_unknown_precision():
    with pytest.raises(ValueError, match="precision must be one of"):
        GemmScaleBatchNorm(K, N, (N,), precision="fp8")
