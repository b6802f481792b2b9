"""Builds and runs a CUDA kernel file's device code on the CPU (tests/emulation/emulation.h), for CI's GPU-less runs.

A driver in tests/emulation/ includes the kernel file as `<name>_source.cpp`, written here with its
cooperative_groups include swapped for the shim; the driver checks every phase against float64 and exits
0 when every case is within its bounds. This checks indexing, counts and arithmetic, not what only a GPU
shows (races between blocks, warp behaviour, speed): the GPU tests do.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EMULATION = ROOT / "tests" / "emulation"
COOPERATIVE_INCLUDE = "#include <cooperative_groups.h>"


def cuda_home() -> Path | None:
    """The CUDA toolkit the extension builds with ($CUDA_HOME, else the nvcc of $CUDACXX or PATH, asked where
    its toolkit is: nvcc may be a wrapper script elsewhere), for its headers and cudart; None if not found."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc")
    if nvcc:
        dry_run = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                                 capture_output=True, text=True)  # fmt: skip
        top = re.search(r"^#\$ TOP=(.+)$", dry_run.stdout + dry_run.stderr, re.MULTILINE)
        candidates += [top.group(1).strip() if top else None, str(Path(nvcc).resolve().parent.parent)]
    for home in filter(None, candidates):
        if (Path(home) / "include" / "cuda_runtime.h").exists():
            return Path(home).resolve()
    return None


def cooperative_source(kernel: Path) -> str:
    """A kernel file's text with its cooperative_groups include replaced by the emulation shim."""
    source = kernel.read_text()
    assert source.count(COOPERATIVE_INCLUDE) == 1, f"{kernel.name}'s includes changed: update tests/_emulation.py"
    return source.replace(COOPERATIVE_INCLUDE, f'#include "{EMULATION / "emulation.h"}"')


DEVICE_CODE_END = "}  // namespace\n"  # the anonymous namespace holding a file's kernels; host code follows


def kernels_only(kernel: Path) -> str:
    """A kernel file's text up to the end of its anonymous namespace (its host launches use <<<...>>>)."""
    source = kernel.read_text()
    assert DEVICE_CODE_END in source, f"{kernel.name}'s layout changed: update tests/_emulation.py"
    return source[: source.index(DEVICE_CODE_END)] + DEVICE_CODE_END + "}  // namespace gemmbn\n"


def build(tmp_path: Path, driver: str, sources: dict[str, str], defines: dict[str, int] | None = None) -> Path:
    """Write ``sources`` (file name -> text) into tmp_path and build tests/emulation/<driver> against them, with the
    preprocessor ``defines`` (a build option's macro, as CMake sets it); the binary. Skips where g++ or the CUDA
    toolkit's headers are missing."""
    cuda, compiler = cuda_home(), shutil.which("g++")
    if cuda is None or compiler is None:
        pytest.skip("needs g++ and the CUDA toolkit's headers (the extension's build needs both too)")
    for name, text in sources.items():
        (tmp_path / name).write_text(text)
    binary = tmp_path / Path(driver).stem
    library = next((d for d in (cuda / "lib64", cuda / "lib") if (d / "libcudart.so").exists()), cuda / "lib64")
    command = [compiler, "-std=c++20", "-O2", "-pthread", f"-I{tmp_path}", f"-I{ROOT / 'kernels' / 'include'}",
               f"-I{ROOT / 'kernels' / 'src'}", f"-I{cuda / 'include'}", str(EMULATION / driver), "-o", str(binary),
               f"-L{library}", "-lcudart", f"-Wl,-rpath,{library}"]  # fmt: skip
    command += [f"-D{name}={value}" for name, value in (defines or {}).items()]
    built = subprocess.run(command, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-4000:]
    return binary


def run_cases(binary: Path, expected_cases: int, shards: int = 1) -> str:
    """Run a built driver; fail with the out-of-bounds lines unless it exits 0 having checked ``expected_cases`` cases.
    With ``shards`` > 1 (a driver that takes `shard I N`), that many processes share the cases, at most one per core.
    Returns its output."""
    shards = max(1, min(shards, os.cpu_count() or 1))
    commands = [[str(binary)]] if shards == 1 else [[str(binary), "shard", str(i), str(shards)] for i in range(shards)]
    running = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]
    outputs = [process.communicate(timeout=600) for process in running]
    stdout = "".join(out for out, _ in outputs)
    print(stdout)
    failed = [(process.returncode, err) for process, (_, err) in zip(running, outputs) if process.returncode != 0]
    assert not failed, "cases out of bounds:\n" + "\n".join(
        line for line in stdout.splitlines() if not line.startswith("ok")
    ) + "".join(err[-2000:] for _, err in failed)
    checked = sum(line.startswith("ok ") for line in stdout.splitlines())
    assert checked == expected_cases, f"{checked} cases checked, {expected_cases} expected: every case must have run"
    return stdout


def build_and_run(tmp_path: Path, driver: str, sources: dict[str, str], expected_cases: int) -> str:
    """build, then run_cases."""
    return run_cases(build(tmp_path, driver, sources), expected_cases)
