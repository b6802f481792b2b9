"""batch_norm_backward's device code executed on the CPU, so CI (no GPU) runs its three phases.

tests/emulation/batch_norm_backward_emulated.cpp compiles kernels/src/batch_norm_backward.cu with the
emulation shim (tests/_emulation.py) and checks dbeta, dgamma, sum_grad_y, dz = s grad_y, dbias and dscale
(where the scale is 0 too) against float64 for float32, bfloat16 and float16: batch and fixed statistics,
ragged shapes, a mean 1e3 times the spread, more column stripes than blocks, the column gradients alone; and for
float32 the variant that also writes dz^T with dz's row and column maxima (bit for bit).
The bounds and their reasons are in that file.
"""

import pytest
from _emulation import ROOT, build_and_run, cooperative_source, kernels_only

pytestmark = pytest.mark.torch_agnostic  # C++ drivers built apart: no torch code runs

KERNELS = ROOT / "kernels" / "src"


def test_batch_norm_backward_on_the_cpu(tmp_path):
    sources = {"batch_norm_backward_source.cpp": cooperative_source(KERNELS / "batch_norm_backward.cu")}
    build_and_run(tmp_path, "batch_norm_backward_emulated.cpp", sources, expected_cases=12 * 3 - 1)


def test_transpose_padded_on_the_cpu(tmp_path):
    """The split GEMM's transposed operands: every element equal, the padding zeros, the rows' and columns' maxima
    (the file has the cases)."""
    sources = {"transpose_padded_source.cpp": kernels_only(KERNELS / "transpose_padded.cu")}
    build_and_run(tmp_path, "transpose_padded_emulated.cpp", sources, expected_cases=4)
