"""precision.resolve follows PyTorch's float32 matmul precision switch; the override context restores it."""

import pytest
import torch

from gemmbn import precision


@pytest.fixture(autouse=True)
def _restore_global_precision():
    saved = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(saved)


@pytest.mark.parametrize(
    ("dtype", "requested", "expected"),
    [
        (torch.float32, "highest", precision.SPLIT_FP32),
        (torch.float32, "high", precision.TF32),
        (torch.float32, "medium", precision.TF32),  # no bf16-internal kernel: PyTorch's rule says "as high"
        (torch.bfloat16, "highest", precision.NATIVE_16BIT),
        (torch.float16, "medium", precision.NATIVE_16BIT),
    ],
)
def test_resolve(dtype, requested, expected):
    assert precision.resolve(dtype, requested) == expected


@pytest.mark.parametrize("global_setting", ["highest", "high", "medium"])
def test_none_follows_torch(global_setting):
    torch.set_float32_matmul_precision(global_setting)
    assert precision.normalize(None) == global_setting
    assert precision.normalize(precision.validate(None)) == global_setting
    expected = precision.SPLIT_FP32 if global_setting == "highest" else precision.TF32
    assert precision.resolve(torch.float32, None) == expected


def test_invalid_values():
    with pytest.raises(ValueError, match="precision must be one of"):
        precision.validate("ieee")
    with pytest.raises(TypeError, match="no fused kernel for torch.float64"):
        precision.resolve(torch.float64, "highest")


def test_override_restores_even_on_error():
    torch.set_float32_matmul_precision("high")
    with precision.float32_matmul_precision("highest"):
        assert torch.get_float32_matmul_precision() == "highest"
    assert torch.get_float32_matmul_precision() == "high"
    with pytest.raises(RuntimeError, match="boom"), precision.float32_matmul_precision("medium"):
        assert torch.get_float32_matmul_precision() == "medium"
        raise RuntimeError("boom")
    assert torch.get_float32_matmul_precision() == "high"
