"""reference.linear_scale_batch_norm against nn.Linear + nn.BatchNorm1d, and its float64 helper."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from _helpers import SAME_OPS, make_pair

from gemmbn import reference

M, K, N = 20, 12, 8
FP32 = SAME_OPS[torch.float32]


def _call(module, x, training, **kwargs):
    """reference.linear_scale_batch_norm on module's own parameters and buffers (mutating them)."""
    bn = module.bn
    return reference.linear_scale_batch_norm(
        x, module.gemm.weight, module.gemm.bias, module.scale, bn.weight, bn.bias,
        bn.running_mean, bn.running_var, bn.num_batches_tracked, training, bn.momentum, bn.eps, **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("momentum", [0.1, None])
def test_training_matches_batchnorm(momentum):
    nn_model, drop_in = make_pair(K, N, momentum=momentum)
    with torch.no_grad():
        for _ in range(3):
            x = torch.rand(M, K)
            out, pre_norm, save_mean, save_invstd = _call(drop_in, x, True, keep_pre_norm=True)
            torch.testing.assert_close(out, nn_model(x), **FP32)
            y = nn_model.gemm(x) * nn_model.scale
            torch.testing.assert_close(pre_norm, y)
            torch.testing.assert_close(save_mean, y.mean(0))
            torch.testing.assert_close(save_invstd, torch.rsqrt(y.var(0, unbiased=False) + nn_model.bn.eps))
            for name in ("running_mean", "running_var"):
                torch.testing.assert_close(getattr(drop_in.bn, name), getattr(nn_model.bn, name), **FP32)
            assert torch.equal(drop_in.bn.num_batches_tracked, nn_model.bn.num_batches_tracked)


def test_eval_uses_running_statistics():
    nn_model, drop_in = make_pair(K, N)
    with torch.no_grad():
        for module in (nn_model, drop_in):
            module.bn.running_mean.copy_(torch.linspace(-1, 1, N))
            module.bn.running_var.copy_(torch.linspace(0.5, 2, N))
        nn_model.eval()
        x = torch.rand(M, K)
        out, pre_norm, save_mean, save_invstd = _call(drop_in, x, False)
    torch.testing.assert_close(out, nn_model(x), **FP32)
    assert pre_norm.numel() == save_mean.numel() == save_invstd.numel() == 0
    assert drop_in.bn.num_batches_tracked.item() == 0


def test_one_row_raises_before_mutation():
    _, drop_in = make_pair(K, N)
    before = [t.clone() for t in drop_in.bn.buffers()]
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        _call(drop_in, torch.rand(1, K), True)
    assert all(torch.equal(a, b) for a, b in zip(drop_in.bn.buffers(), before))


class _RecordOps(TorchDispatchMode):
    """Records every aten op that runs under it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


HOST_READ = torch.ops.aten._local_scalar_dense.default  # what .item(), float(t), bool(t) dispatch to


def test_momentum_none_reads_nothing_on_the_host():
    """The 1/num_batches_tracked factor stays a device tensor: no .item()/float(tensor) anywhere."""
    nn_model, drop_in = make_pair(K, N, momentum=None)
    x = torch.rand(M, K)
    with torch.no_grad(), _RecordOps() as recorded:
        out, *_ = _call(drop_in, x, True)
        drop_in(x)  # the module's Python layers around the operator, too
    assert HOST_READ not in recorded.ops
    assert torch.ops.aten.reciprocal.default in recorded.ops
    with torch.no_grad():
        torch.testing.assert_close(out, nn_model(x), **FP32)
        nn_model(x)
    torch.testing.assert_close(drop_in.bn.running_var, nn_model.bn.running_var, **FP32)


def test_host_read_detector_works():
    with _RecordOps() as recorded:
        float(torch.tensor(2.0))
    assert HOST_READ in recorded.ops


def test_float64_forward_matches_module():
    nn_model, _ = make_pair(K, N)
    x = torch.rand(M, K)
    out64, bn64 = reference.float64_forward(nn_model, x)
    assert out64.dtype == torch.float64 and bn64.running_mean.dtype == torch.float64
    assert nn_model.bn.num_batches_tracked.item() == 0  # the helper worked on copies
    with torch.no_grad():
        torch.testing.assert_close(nn_model(x), out64.float(), **FP32)
    torch.testing.assert_close(nn_model.bn.running_var, bn64.running_var.float(), **FP32)
