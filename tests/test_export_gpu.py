"""torch.export of a model holding GemmScaleBatchNorm (eval mode), then AOTInductor packaging.

The exported program calls the native operator gemmbn::eval_forward (no Python custom op, no PyTorch GEMM) and gives
the eager module's output bitwise (the same kernels on the same inputs). Loading an AOTInductor package crashes the
process on the H200 with torch 2.11 for a model of PyTorch's own layers too (a segmentation fault in the package's
generated code, perf/NOTES.md v15), so that step runs in a child process: a crash that the plain model shares is
reported as an expected failure, any other failure (or a crash of ours alone) fails, and success passes.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import requires_sm90
from torch import nn

from _gpu import DEVICE, fused_path, require_extension

from gemmbn import GemmScaleBatchNorm

pytestmark = [pytest.mark.gpu, requires_sm90]

CASES = [(torch.bfloat16, None), (torch.float32, "highest")]
CASE_IDS = ["bf16", "fp32-highest"]


@pytest.fixture(scope="module", autouse=True)
def _built():
    require_extension()


def _model_and_input(dtype, precision):
    torch.manual_seed(0)
    layer = GemmScaleBatchNorm(512, 264, (264,), precision=precision)
    with torch.no_grad():  # running statistics away from (0, 1), so that the eval forward's fold shows
        layer.bn.running_mean.normal_()
        layer.bn.running_var.uniform_(0.5, 2.0)
    model = nn.Sequential(layer, nn.ReLU()).to(DEVICE, dtype).eval()
    return model, torch.randn(200, 512, device=DEVICE, dtype=dtype)


@pytest.mark.parametrize(("dtype", "precision"), CASES, ids=CASE_IDS)
def test_the_exported_program_calls_the_native_operator(dtype, precision):
    model, x = _model_and_input(dtype, precision)
    with fused_path(), torch.no_grad():
        expected = model(x)
        program = torch.export.export(model, (x,))
        assert torch.equal(program.module()(x), expected)
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert "gemmbn.eval_forward.default" in targets, targets
    assert not any("linear_scale_bn" in t or "addmm" in t or "aten.mm" in t for t in targets), targets


_AOTI_SCRIPT = """
import sys, torch
sys.path[:0] = {path!r}
from test_export_gpu import _model_and_input, _plain_model_and_input
model, x = (_plain_model_and_input if {plain!r} else _model_and_input)(getattr(torch, {dtype!r}), {precision!r})
with torch.no_grad():
    expected = model(x)
    program = torch.export.export(model, (x,))
    # The test checks the package's output, not its speed: without precompiled headers and with an unoptimized wrapper
    # the package compiles in about half the time (a CPU model here: 15 -> 8 s).
    configs = {{"aot_inductor.precompile_headers": False, "aot_inductor.compile_wrapper_opt_level": "O0"}}
    package = torch._inductor.aoti_compile_and_package(program, package_path={package!r}, inductor_configs=configs)
    loaded = torch._inductor.aoti_load_package(package)
    sys.exit(0 if torch.equal(loaded(x), expected) else 3)
"""


def _plain_model_and_input(dtype, precision):
    """The same model with PyTorch's own layers (no gemmbn): whether AOTInductor works here at all."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 264), nn.BatchNorm1d(264), nn.ReLU()).to(DEVICE, dtype).eval()
    return model, torch.randn(200, 512, device=DEVICE, dtype=dtype)


def _package_and_load(tmp_path, plain: bool) -> subprocess.CompletedProcess:
    script = textwrap.dedent(_AOTI_SCRIPT).format(path=sys.path, plain=plain, dtype="bfloat16", precision=None,
                                                  package=str(tmp_path / f"model-{plain}.pt2"))  # fmt: skip
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)


def test_the_aoti_package_gives_the_same_output(tmp_path):
    child = _package_and_load(tmp_path, plain=False)
    if child.returncode == -signal.SIGSEGV and _package_and_load(tmp_path, plain=True).returncode == -signal.SIGSEGV:
        # On the H200 with torch 2.11 the package loader crashes in the generated wrapper's own code (std::regex in
        # parse_device_str) for a model without gemmbn too: the machine's AOTInductor runtime, not this layer.
        pytest.xfail("aoti_load_package crashes here for a plain PyTorch model too (perf/NOTES.md v15)")
    assert child.returncode == 0, child.stderr[-2000:]
