"""The fp32-faithful GEMM's operand kernels (kernels/src/split_operands.cu) executed on the CPU, so CI (no GPU)
runs them: split_columns' column maxima and tiled split against split_weight's kernel on the transposed matrix, bit
for bit (tests/emulation/split_columns_emulated.cpp has the cases). The GPU tests check the same on the device."""

from _emulation import ROOT, build_and_run, kernels_only

KERNELS = ROOT / "kernels" / "src"


def test_split_columns_is_split_weight_of_the_transpose_on_the_cpu(tmp_path):
    sources = {"split_operands_source.cpp": kernels_only(KERNELS / "split_operands.cu")}
    build_and_run(tmp_path, "split_columns_emulated.cpp", sources, expected_cases=6)
