"""GemmScaleBatchNorm behaves as the reference Model (nn.Linear, * scale, nn.BatchNorm1d): CPU fallback."""

import copy
import warnings

import pytest
import torch
from _helpers import SAME_OPS, assert_state_equal, make_pair, snapshot
from conftest import requires_sm90

from gemmbn import GemmBnFallbackWarning, GemmScaleBatchNorm, kernelbench

FP32 = SAME_OPS[torch.float32]
M, K, N = 32, 24, 16

OPTIONS = {
    "default": {},
    "momentum_none": {"momentum": None},
    "affine_off": {"affine": False},
    "no_bias": {"bias": False},
    "tracking_off": {"track_running_stats": False},
    "eps_momentum": {"eps": 1e-3, "momentum": 0.3},
    "scale_scalar_shape": {"scale_shape": (1,)},
    "scale_row_shape": {"scale_shape": (1, N)},
}


def _step_and_compare(reference, drop_in, rows=M):
    """One forward of both on fresh data: outputs and every parameter/buffer must agree."""
    x = torch.rand(rows, K) * 2 - 0.5
    torch.testing.assert_close(drop_in(x), reference(x), **FP32)
    assert_state_equal(drop_in, snapshot(reference), **FP32)


@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_training_steps_then_eval_match_reference(options):
    reference, drop_in = make_pair(K, N, **options)
    for _ in range(3):
        _step_and_compare(reference, drop_in)
    if drop_in.bn.track_running_stats:
        assert drop_in.bn.num_batches_tracked.item() == 3
        assert not torch.equal(drop_in.bn.running_mean, torch.zeros(N))
    reference.eval()
    drop_in.eval()
    before = snapshot(drop_in)
    _step_and_compare(reference, drop_in)
    assert_state_equal(drop_in, before)  # eval mode moves nothing


def test_momentum_none_is_cumulative_average():
    reference, drop_in = make_pair(K, N, momentum=None)
    batches = [torch.rand(M, K) for _ in range(4)]
    for x in batches:
        torch.testing.assert_close(drop_in(x), reference(x), **FP32)
    # Cumulative average of the per-batch means of y.
    with torch.no_grad():
        means = torch.stack([(drop_in.gemm(x) * drop_in.scale).mean(0) for x in batches])
    torch.testing.assert_close(drop_in.bn.running_mean, means.mean(0), **FP32)
    assert_state_equal(drop_in, snapshot(reference), **FP32)


def test_eval_accepts_one_row():
    reference, drop_in = make_pair(K, N)
    _step_and_compare(reference, drop_in)
    reference.eval()
    drop_in.eval()
    _step_and_compare(reference, drop_in, rows=1)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, requires_sm90])])
@pytest.mark.parametrize("options", [{}, {"momentum": None}], ids=["momentum", "momentum_none"])
def test_empty_batch_is_batchnorms(device, options):
    """A batch of no rows, as nn.BatchNorm1d takes it: an empty output, the running statistics as they were and
    the batch counted; the backward gives x an empty gradient and every parameter a zero one; eval returns an
    empty output. Nothing falls back (no warning): no kernel is needed."""
    reference, drop_in = (m.to(device) for m in make_pair(K, N, **options))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GemmBnFallbackWarning)  # the CPU's fallback on the non-empty batch
        x = torch.rand(M, K, device=device)
        reference(x), drop_in(x)  # non-trivial running statistics
    before = {module: snapshot(module) for module in (reference, drop_in)}
    gradients = []
    for module in (reference, drop_in):
        x = torch.rand(0, K, device=device, requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error", GemmBnFallbackWarning)
            out = module(x)
            out.sum().backward()
        assert out.shape == (0, N)
        gradients.append({"x": x.grad, **{name: p.grad for name, p in module.named_parameters()}})
    for module, state in before.items():
        state["bn.num_batches_tracked"] += 1  # the empty batch is counted, nothing else moves
        assert_state_equal(module, state)
    for name, grad in gradients[1].items():
        torch.testing.assert_close(grad, gradients[0][name], rtol=0, atol=0, msg=name)
    assert all(not g.any() for g in gradients[1].values())
    drop_in.eval()
    assert drop_in(torch.rand(0, K, device=device)).shape == (0, N)


def test_follows_bn_attribute_changes():
    """forward reads bn's current training flag, momentum, eps and tracking, as nn.BatchNorm1d does."""
    reference, drop_in = make_pair(K, N)
    changes = [
        lambda m: setattr(m.bn, "momentum", None),
        lambda m: setattr(m.bn, "eps", 1e-2),
        lambda m: m.bn.eval(),  # only bn: the outer module stays in training mode
        lambda m: setattr(m.bn, "track_running_stats", False),  # eval: buffers still used
        lambda m: m.bn.train(),  # training without tracking: batch stats, buffers untouched
        lambda m: setattr(m.bn, "track_running_stats", True),
    ]
    for change in changes:
        change(reference)
        change(drop_in)
        _step_and_compare(reference, drop_in)


def test_same_seed_gives_identical_parameters():
    torch.manual_seed(7)
    model = kernelbench.Model(K, N, (N,))
    torch.manual_seed(7)
    drop_in = kernelbench.ModelNew(K, N, (N,))
    assert list(model.state_dict()) == list(drop_in.state_dict())
    assert list(drop_in.state_dict()) == [
        "scale", "gemm.weight", "gemm.bias", "bn.weight", "bn.bias",
        "bn.running_mean", "bn.running_var", "bn.num_batches_tracked",
    ]  # fmt: skip
    assert_state_equal(drop_in, snapshot(model))


def test_state_dict_round_trips_both_ways():
    torch.manual_seed(1)
    model = kernelbench.Model(K, N, (N,))
    drop_in = GemmScaleBatchNorm(K, N, (N,))  # different random init
    for _ in range(2):
        model(torch.rand(M, K))
    drop_in.load_state_dict(model.state_dict())
    assert_state_equal(drop_in, snapshot(model))
    _step_and_compare(model, drop_in)

    for _ in range(2):
        drop_in(torch.rand(M, K))
    fresh = kernelbench.Model(K, N, (N,))
    fresh.load_state_dict(drop_in.state_dict())
    assert_state_equal(fresh, snapshot(drop_in))
    _step_and_compare(fresh, drop_in)


def test_from_module_shares_parameters_and_buffers():
    torch.manual_seed(2)
    model = kernelbench.Model(K, N, (N,))
    model(torch.rand(M, K))
    twin = copy.deepcopy(model)
    drop_in = GemmScaleBatchNorm.from_module(model, precision="high")
    assert drop_in.precision == "high"
    assert drop_in.gemm is model.gemm and drop_in.bn is model.bn and drop_in.scale is model.scale
    x = torch.rand(M, K)
    torch.testing.assert_close(drop_in(x), twin(x), **FP32)
    # The step moved the model's own buffers (shared, not copied).
    assert_state_equal(model, snapshot(twin), **FP32)
    assert model.bn.num_batches_tracked.item() == 2


def test_from_module_rejects_other_models():
    with pytest.raises(TypeError, match="gemm"):
        GemmScaleBatchNorm.from_module(torch.nn.Linear(4, 4))


def test_extra_repr_shows_precision():
    assert "precision='high'" in repr(GemmScaleBatchNorm(K, N, (N,), precision="high"))
    assert "precision=None" in repr(GemmScaleBatchNorm(K, N, (N,)))


def test_kernelbench_problems_39_and_33():
    """import gemmbn reaches gemmbn.kernelbench; its top level is problem 39, problem(33) gives problem 33."""
    import gemmbn

    assert gemmbn.kernelbench is kernelbench
    p39, p33 = kernelbench.problem(39), kernelbench.problem(33)
    assert (p39.batch_size, p39.in_features, p39.out_features) == (16384, 4096, 4096)
    assert (p33.batch_size, p33.get_init_inputs()) == (1024, [8192, 8192, (8192,)])
    assert p33.Model is kernelbench.Model and p33.ModelNew is kernelbench.ModelNew
    with pytest.raises(ValueError, match="problems \\[33, 39\\]"):
        kernelbench.problem(40)


def test_kernelbench_problem(monkeypatch):
    assert kernelbench.get_init_inputs() == [4096, 4096, (4096,)]
    assert (kernelbench.batch_size, kernelbench.in_features) == (16384, 4096)
    monkeypatch.setattr(kernelbench, "batch_size", 8)
    monkeypatch.setattr(kernelbench, "in_features", K)
    (x,) = kernelbench.get_inputs()
    assert x.shape == (8, K) and x.min() >= 0 and x.max() < 1 and x.std() > 0
    reference, drop_in = make_pair(K, N)
    torch.testing.assert_close(drop_in(x), reference(x), **FP32)
