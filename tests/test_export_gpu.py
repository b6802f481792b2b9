"""torch.export of a model holding GemmScaleBatchNorm (eval mode), then AOTInductor packaging.

The exported program calls the native operator gemmbn::eval_forward (no Python custom op, no PyTorch GEMM) and gives
the eager module's output bitwise (the same kernels on the same inputs). Loading the AOTInductor package crashed the
process on the H200 with torch 2.11 (a segmentation fault, perf/NOTES.md v14), so that step runs in a child process:
that crash is reported as an expected failure, any other failure fails, and success passes.
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
from test_export_gpu import _model_and_input
model, x = _model_and_input(getattr(torch, {dtype!r}), {precision!r})
with torch.no_grad():
    expected = model(x)
    program = torch.export.export(model, (x,))
    package = torch._inductor.aoti_compile_and_package(program, package_path={package!r})
    loaded = torch._inductor.aoti_load_package(package)
    sys.exit(0 if torch.equal(loaded(x), expected) else 3)
"""


def test_the_aoti_package_gives_the_same_output(tmp_path):
    script = textwrap.dedent(_AOTI_SCRIPT).format(
        path=sys.path, dtype="bfloat16", precision=None, package=str(tmp_path / "model.pt2")
    )
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    if child.returncode == -signal.SIGSEGV:
        pytest.xfail("aoti_load_package segfaults on this package (known on torch 2.11: perf/NOTES.md v14)")
    assert child.returncode == 0, child.stderr[-2000:]
