"""Whether two builds of the operators compile to the same machine code, kernel by kernel; and their sizes.

    python perf/sass_diff.py [--counts] A/_operators.so B/_operators.so

For a change that must not move the kernels (a refactor of a kernel header, a host-side change, a build option that is
off): disassembles both libraries with cuobjdump (the CUDA toolkit's; the device has it), hashes each kernel's SASS
with the instruction addresses removed, and prints how many kernels match and the names of those that differ or are
in one build only. --counts also prints, for each kernel in both whose SASS differs, its instruction count in A and in
B and their ratio, and the totals (a change meant to shrink the kernels' code: perf/NOTES.md v61).
Exit status 0 when every kernel matches.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys

ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")  # the /*0a30*/ comment that starts each instruction line


def kernel_listings(library: str) -> dict[str, tuple[str, int]]:
    """Kernel name -> (md5 of its SASS with the addresses stripped, its instruction count)."""
    sass = subprocess.run(["cuobjdump", "-sass", library], capture_output=True, text=True, check=True).stdout
    bodies: dict[str, list[str]] = {}
    current = None
    for line in sass.splitlines():
        function = re.match(r"\s+Function : (\S+)", line)
        if function:
            current = function.group(1)
            bodies[current] = []
        elif current is not None:
            bodies[current].append(line)
    return {
        name: (hashlib.md5("\n".join(ADDRESS.sub("", line) for line in body).encode()).hexdigest(),
               sum(1 for line in body if ADDRESS.search(line)))
        for name, body in bodies.items()
    }  # fmt: skip


def main() -> int:
    args = sys.argv[1:]
    counts = "--counts" in args
    paths = [arg for arg in args if arg != "--counts"]
    if len(paths) != 2 or len(args) - len(paths) > 1:
        sys.exit(__doc__)
    a, b = kernel_listings(paths[0]), kernel_listings(paths[1])
    common = a.keys() & b.keys()
    differ = sorted(name for name in common if a[name][0] != b[name][0])
    print(f"{len(a)} / {len(b)} kernels; {len(common)} in both, {len(common) - len(differ)} with identical SASS")
    if counts:
        print("instructions A, B, B/A of the kernels that differ:")
        for name in sorted(differ, key=lambda n: -a[n][1]):
            print(f"{a[name][1]:8d} {b[name][1]:8d} {b[name][1] / max(a[name][1], 1):6.2f}  {name[:100]}")
        total_a, total_b = sum(a[n][1] for n in common), sum(b[n][1] for n in common)
        print(f"{total_a:8d} {total_b:8d} {total_b / max(total_a, 1):6.2f}  all {len(common)} kernels in both")
    else:
        for name in differ:
            print("differs:", name)
    for name in sorted(a.keys() ^ b.keys()):
        print("in one build only:", name)
    return 0 if not differ and a.keys() == b.keys() else 1


if __name__ == "__main__":
    sys.exit(main())
