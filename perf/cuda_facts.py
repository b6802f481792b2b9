"""What the perf tools ask of the CUDA runtime beyond torch, through cuda-python (the `perf` extra, not a dependency
of gemmbn itself):

    python perf/cuda_facts.py [--device 0]

- device_facts: SM count, L2 size, the rated SM and memory clocks and the memory bus, and from them the DRAM's
  peak bandwidth: what a measured bandwidth (perf/finish_bandwidth.py) or clock (perf/clocks_under_load.py) is a
  fraction of. torch reports the SM count and L2 size but no clocks.
- profiled: cudaProfilerStart / cudaProfilerStop around the launches Nsight Compute should capture, for
  `ncu --profile-from-start off` (perf/ncu/profile.sh): the profile then holds exactly those kernels, none of the
  set-up's (weight split, allocations' fills, warm-up).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from cuda.bindings import runtime as cudart

_ATTRIBUTES = {  # fact -> cudaDeviceAttr
    "sm_count": cudart.cudaDeviceAttr.cudaDevAttrMultiProcessorCount,
    "l2_bytes": cudart.cudaDeviceAttr.cudaDevAttrL2CacheSize,
    "sm_clock_khz": cudart.cudaDeviceAttr.cudaDevAttrClockRate,  # rated maximum, not the current clock
    "memory_clock_khz": cudart.cudaDeviceAttr.cudaDevAttrMemoryClockRate,
    "memory_bus_bits": cudart.cudaDeviceAttr.cudaDevAttrGlobalMemoryBusWidth,
    "compute_capability_major": cudart.cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor,
    "compute_capability_minor": cudart.cudaDeviceAttr.cudaDevAttrComputeCapabilityMinor,
}


def _checked(result: tuple, what: str):
    """A cuda-python call's values, or RuntimeError naming the call and the CUDA error."""
    error, *values = result
    if error != cudart.cudaError_t.cudaSuccess:
        raise RuntimeError(f"{what} failed: {error.name}")
    return values[0] if len(values) == 1 else tuple(values)


def device_facts(device: int = 0) -> dict[str, float]:
    """The device's attributes (_ATTRIBUTES) and its DRAM peak bandwidth in GB/s (double data rate x bus width)."""
    facts = {name: _checked(cudart.cudaDeviceGetAttribute(attribute, device), f"cudaDeviceGetAttribute({name})")
             for name, attribute in _ATTRIBUTES.items()}  # fmt: skip
    facts["peak_bandwidth_gbs"] = 2 * facts["memory_clock_khz"] * 1e3 * facts["memory_bus_bits"] / 8 / 1e9
    return facts


@contextlib.contextmanager
def profiled() -> Iterator[None]:
    """Nsight's capture range: started here, stopped on leaving (after the device has finished the range's work)."""
    _checked(cudart.cudaProfilerStart(), "cudaProfilerStart")
    try:
        yield
    finally:
        _checked(cudart.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        _checked(cudart.cudaProfilerStop(), "cudaProfilerStop")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=int, default=0)
    for name, value in device_facts(parser.parse_args().device).items():
        print(f"{name:26} {value:g}")


if __name__ == "__main__":
    main()
