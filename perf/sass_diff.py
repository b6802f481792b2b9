"""Whether two builds of the operators compile to the same machine code, kernel by kernel.

    python perf/sass_diff.py A/_operators.so B/_operators.so

For a change that must not move the kernels (a refactor of a kernel header, a host-side launch change): disassembles
both libraries with cuobjdump (the CUDA toolkit's; the device has it), hashes each kernel's SASS with the instruction
addresses removed, and prints how many kernels match and the names of those that differ or are in one build only.
Exit status 0 when every kernel matches.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys


def kernel_hashes(library: str) -> dict[str, str]:
    """Kernel name -> md5 of its SASS, addresses stripped."""
    sass = subprocess.run(["cuobjdump", "-sass", library], capture_output=True, text=True, check=True).stdout
    bodies: dict[str, list[str]] = {}
    current = None
    for line in sass.splitlines():
        function = re.match(r"\s+Function : (\S+)", line)
        if function:
            current = function.group(1)
            bodies[current] = []
        elif current is not None:
            bodies[current].append(re.sub(r"/\*[0-9a-f]{4,}\*/", "", line))  # the /*0a30*/ address comments
    return {name: hashlib.md5("\n".join(body).encode()).hexdigest() for name, body in bodies.items()}


def main() -> int:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = kernel_hashes(sys.argv[1]), kernel_hashes(sys.argv[2])
    common = a.keys() & b.keys()
    differ = sorted(name for name in common if a[name] != b[name])
    print(f"{len(a)} / {len(b)} kernels; {len(common)} in both, {len(common) - len(differ)} with identical SASS")
    for name in differ:
        print("differs:", name)
    for name in sorted(a.keys() ^ b.keys()):
        print("in one build only:", name)
    return 0 if not differ and a.keys() == b.keys() else 1


if __name__ == "__main__":
    sys.exit(main())
