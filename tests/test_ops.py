"""The custom operators pass torch.library.opcheck; the module compiles with fullgraph=True (CPU)."""

import copy

import pytest
import torch
from _helpers import GRAD_TOLERANCE, SAME_OPS, assert_state_equal, grads, make_pair, snapshot

import gemmbn.ops  # noqa: F401  (registers torch.ops.gemmbn.*)

M, K, N = 12, 8, 6


def _operands(requires_grad):
    torch.manual_seed(0)
    tensors = [torch.rand(M, K), torch.randn(N, K), torch.randn(N), torch.randn(N), torch.randn(N), torch.randn(N)]
    return [t.requires_grad_(requires_grad) for t in tensors]


def _running_stats():
    return torch.randn(N), torch.rand(N) + 0.5


@pytest.mark.parametrize("affine", [True, False])
def test_opcheck_eval(affine):
    x, weight, bias, scale, gamma, beta = _operands(requires_grad=True)
    if not affine:
        gamma = beta = None
    args = (x, weight, bias, scale, gamma, beta, *_running_stats(), 1e-5, "highest")
    torch.library.opcheck(torch.ops.gemmbn.linear_scale_bn_eval.default, args)


# linear_scale_bn_train mutates its running statistics, and PyTorch refuses register_autograd on
# mutating ops, so its gradient lives in an autograd.Function (tested below and in test_autograd.py);
# opcheck's autograd-registration test needs an op-level formula and is left out here.
TRAIN_UTILS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("keep_pre_norm", [False, True])
@pytest.mark.parametrize("tracking", [True, False])
def test_opcheck_train(momentum, keep_pre_norm, tracking):
    x, weight, bias, scale, gamma, beta = _operands(requires_grad=False)
    running = (*_running_stats(), torch.tensor(4)) if tracking else (None, None, None)
    args = (x, weight, bias, scale, gamma, beta, *running, momentum, 1e-5, "high", keep_pre_norm)
    torch.library.opcheck(torch.ops.gemmbn.linear_scale_bn_train.default, args, test_utils=TRAIN_UTILS)


# The backward operator has no gradient of its own (double backward is refused), so opcheck's
# autograd-registration test does not apply.
BACKWARD_UTILS = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")


@pytest.mark.parametrize("batch_statistics", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("needs", [[True] * 6, [True, False, False, True, False, True], [False] * 5 + [True]],
                         ids=["all", "some", "beta-only"])  # fmt: skip
@pytest.mark.parametrize("affine", [True, False])
def test_opcheck_backward(batch_statistics, needs, affine):
    x, weight, bias, scale, gamma, beta = _operands(requires_grad=False)
    if not affine:
        gamma = beta = None
    y = torch.nn.functional.linear(x, weight, bias) * scale
    var, mean = torch.var_mean(y, dim=0, correction=0)
    dout = torch.randn(M, N)
    args = (dout, x, weight, bias, scale, gamma, beta, y, mean, torch.rsqrt(var + 1e-5), batch_statistics, needs,
            "highest")  # fmt: skip
    torch.library.opcheck(torch.ops.gemmbn.linear_scale_bn_backward.default, args, test_utils=BACKWARD_UTILS)


@pytest.mark.parametrize("keep_pre_norm", [False, True])
def test_train_outputs(keep_pre_norm):
    x, weight, bias, scale, gamma, beta = _operands(requires_grad=False)
    running_mean, running_var = _running_stats()
    counter = torch.tensor(4)
    out, pre_norm, save_mean, save_invstd = torch.ops.gemmbn.linear_scale_bn_train(
        x, weight, bias, scale, gamma, beta, running_mean, running_var, counter, None, 1e-5, "highest", keep_pre_norm
    )
    y = torch.nn.functional.linear(x, weight, bias) * scale
    assert pre_norm.shape == ((M, N) if keep_pre_norm else (0,))
    if keep_pre_norm:
        torch.testing.assert_close(pre_norm, y)
    torch.testing.assert_close(save_mean, y.mean(0))
    torch.testing.assert_close(save_invstd, torch.rsqrt(y.var(0, unbiased=False) + 1e-5))
    torch.testing.assert_close(out, (y - y.mean(0)) * save_invstd * gamma + beta, **SAME_OPS[torch.float32])
    assert counter.item() == 5


# (training, with gradients) per call; each new combination is one more compilation, and inductor's
# are slow on a CPU, so it gets the training step with gradients and the eval inference only.
COMPILE_STEPS = {
    "aot_eager": [(True, True), (True, True), (True, False), (False, True), (False, False)],
    "inductor": [(True, True), (True, True), (False, False)],
}


@pytest.mark.parametrize("backend", COMPILE_STEPS.keys())
def test_compile_fullgraph_matches_eager(backend):
    """torch.compile(fullgraph=True) of the module (momentum None) matches eager: outputs, buffers, grads."""
    _, eager = make_pair(K, N, momentum=None)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True, backend=backend)
    for training, with_grad in COMPILE_STEPS[backend]:
        eager.train(training)
        compiled_model.train(training)
        x = torch.rand(M, K)
        if with_grad:
            expected, actual = grads(eager, x), grads(compiled, x)
            assert actual.keys() == expected.keys()
            for name, grad in expected.items():
                torch.testing.assert_close(actual[name], grad, **GRAD_TOLERANCE[torch.float32])
        else:
            with torch.no_grad():
                torch.testing.assert_close(compiled(x), eager(x), **SAME_OPS[torch.float32])
        assert_state_equal(compiled_model, snapshot(eager), **SAME_OPS[torch.float32])
    trained = sum(training for training, _ in COMPILE_STEPS[backend])
    assert compiled_model.bn.num_batches_tracked.item() == trained


def test_export_of_an_eval_model_runs_the_implementation():
    """torch.export traces the eval forward's implementation (tests/test_export_gpu.py: the native operator on a GPU;
    here the reference route): the exported program gives the module's output."""
    import warnings

    from gemmbn import GemmScaleBatchNorm

    torch.manual_seed(0)
    model = torch.nn.Sequential(GemmScaleBatchNorm(K, N, (N,))).eval()
    x = torch.randn(M, K)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning (no GPU here)
        program = torch.export.export(model, (x,))
        assert torch.equal(program.module()(x), model(x))
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert not any("linear_scale_bn" in t for t in targets), targets  # traced through, not the Python operator
