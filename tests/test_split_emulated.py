"""The fp32-faithful GEMM's operand kernels (kernels/src/split_operands.cu) executed on the CPU, so CI (no GPU)
runs them: split_columns' column maxima and tiled split against split_weight's kernel on the transposed matrix, and
row_scales's split of x against split_weight's kernel on x, bit for bit (tests/emulation/split_columns_emulated.cpp
has the cases). The GPU tests check the same on the device."""

import pytest
from _emulation import ROOT, build_and_run, kernels_only

pytestmark = pytest.mark.torch_agnostic  # C++ drivers built apart: no torch code runs

KERNELS = ROOT / "kernels" / "src"


def test_split_columns_and_split_rows_are_split_weight_on_the_cpu(tmp_path):
    sources = {"split_operands_source.cpp": kernels_only(KERNELS / "split_operands.cu")}
    build_and_run(tmp_path, "split_columns_emulated.cpp", sources, expected_cases=9)
