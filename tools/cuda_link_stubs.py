#!/usr/bin/env python3
"""Link stubs for building candle's CUDA backend on a machine without the NVIDIA driver.

candle's `cuda` feature makes cudarc link libcuda, cuBLAS, cuBLASLt and cuRAND at build time
(`dynamic-linking`). A machine without a GPU has none of them, so this writes shared libraries
with the same sonames that define every function cudarc's bindings declare (empty bodies,
never called): the linker records the sonames, and the GPU machine's real libraries are loaded
at run time. Usage: tools/cuda_link_stubs.py OUT_DIR (run from the repository root).
"""

import json
import pathlib
import re
import subprocess
import sys

# (cudarc module, library name, soname version) as the CUDA 13 libraries name themselves.
LIBRARIES = [
    ("driver", "cuda", "1"),
    ("cublas", "cublas", "13"),
    ("cublaslt", "cublasLt", "13"),
    ("curand", "curand", "10"),
]


def cudarc_source() -> pathlib.Path:
    meta = json.loads(
        subprocess.check_output(
            ["cargo", "metadata", "--format-version", "1", "--locked"], text=True
        )
    )
    for package in meta["packages"]:
        if package["name"] == "cudarc":
            return pathlib.Path(package["manifest_path"]).parent / "src"
    sys.exit("cuda_link_stubs: cudarc is not in the workspace's dependencies")


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: tools/cuda_link_stubs.py OUT_DIR")
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    src = cudarc_source()
    for module, name, version in LIBRARIES:
        text = (src / module / "sys" / "mod.rs").read_text()
        names = sorted(set(re.findall(r'extern "C" \{\s*fn (\w+)\(', text)))
        if not names:
            sys.exit(f"cuda_link_stubs: no functions found in cudarc's {module} bindings")
        c_file = out / f"{name}.c"
        c_file.write_text("".join(f"void {n}(void) {{}}\n" for n in names))
        soname = f"lib{name}.so.{version}"
        subprocess.check_call(
            ["cc", "-shared", "-fPIC", "-o", str(out / soname), f"-Wl,-soname,{soname}", str(c_file)]
        )
        link = out / f"lib{name}.so"
        link.unlink(missing_ok=True)
        link.symlink_to(soname)
        print(f"{soname}: {len(names)} stub functions")


if __name__ == "__main__":
    main()
