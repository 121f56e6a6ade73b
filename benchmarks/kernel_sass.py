"""The instructions in a CUDA kernel's loops, read off its machine code: no GPU needed.

    python benchmarks/kernel_sass.py [--source layer_pass.cu] [--define GLN_PER_LANE=25 ...]
                                     [--kernel NAME ...] [--compare REV]

Compiles a source of ``gln/kernels`` for Hopper (sm_90) with the options CuPy is given
(``gln.kernels.cuda.COMPILE_OPTIONS``), by NVRTC as CuPy does (``benchmarks/nvrtc.py``) or,
without it, by nvcc, disassembles each kernel with cuobjdump (``$CUOBJDUMP``, PATH, NVIDIA's
``nvidia-cuda-cuobjdump`` wheel with ``nvidia-cuda-nvdisasm``, which it runs, or the copies in
Triton's), and prints one JSON line per loop (the
body of a backward branch, at least ``--min-instructions`` long): the kernel, the loop's
addresses, its instructions, and how many of them move shared or global memory, multiply and
add, shuffle or compare. With ``--compare REV`` the same source at git revision REV comes
first, so that a change's instruction counts stand side by side with those before it. Where a
loop is issue-bound, fewer instructions a pass is time saved; whether it is, only a GPU says.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPOSITORY))

from benchmarks import nvrtc  # noqa: E402

KERNELS = REPOSITORY / "gln" / "kernels"
LAYER_KERNELS = ("gln_layer_predict_shared", "gln_layer_pass_resident",
                 "gln_layer_pass_streaming")
# What a line counts, by opcode (the instruction's first word, less its modifiers).
OPCODE_KINDS = {"LDS": "shared_loads", "STS": "shared_stores", "LDG": "global_loads",
                "STG": "global_stores", "FFMA": "fmas", "SHFL": "shuffles",
                "ISETP": "integer_compares"}
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"^(?:@!?U?P\w+\s+)?BRA\s+(0x[0-9a-f]+)")


def instructions(sass: str) -> list[tuple[int, str]]:
    """(address, text) of each instruction in cuobjdump's listing of one kernel."""
    found = []
    for line in sass.splitlines():
        match = _INSTRUCTION.match(line)
        if match:
            found.append((int(match.group(1), 16), match.group(2)))
    return found


def opcode(text: str) -> str:
    """An instruction's opcode without predicate or modifiers: ``@!P0 LDS.128 R0`` is LDS."""
    words = text.split()
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def loops(sass: str, min_instructions: int = 1) -> Iterator[dict]:
    """Each backward branch's loop: from its target to the branch, with counts by kind."""
    listing = instructions(sass)
    for address, text in listing:
        branch = _BRANCH.match(text)
        if not branch or int(branch.group(1), 16) >= address:
            continue
        start = int(branch.group(1), 16)
        body = [opcode(t) for a, t in listing if start <= a <= address]
        if len(body) < min_instructions:
            continue
        counts = {kind: sum(op == name for op in body) for name, kind in OPCODE_KINDS.items()}
        yield {"start": hex(start), "end": hex(address), "instructions": len(body), **counts}


def cuobjdump() -> str:
    """cuobjdump: ``$CUOBJDUMP``, on PATH, or the one NVIDIA's or Triton's wheel carries."""
    candidates = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")]
    for package, folder in (("nvidia", "cu13/bin"), ("triton", "backends/nvidia/bin")):
        spec = importlib.util.find_spec(package)
        for root in (spec.submodule_search_locations or []) if spec else []:
            candidates.append(str(Path(root, folder, "cuobjdump")))
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError("no cuobjdump: set CUOBJDUMP, put the CUDA toolkit's on PATH, or "
                            "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")


def compiled(source: str, defines: list[str]) -> bytes:
    """``source`` (CUDA text) as sm_90 machine code: NVRTC's, as CuPy compiles it, or nvcc's."""
    from gln.kernels.cuda import COMPILE_OPTIONS  # noqa: PLC0415

    options = [*COMPILE_OPTIONS, *(f"-D{d}" for d in defines)]
    if nvrtc.library() is not None:
        result = nvrtc.compile_source(source, "kernel.cu", options)
        if result.status:
            raise RuntimeError(f"NVRTC: {result.log}")
        return result.cubin
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("neither NVRTC (GLN_NVRTC) nor nvcc was found")
    with tempfile.TemporaryDirectory() as directory:
        path, cubin = Path(directory) / "kernel.cu", Path(directory) / "kernel.cubin"
        path.write_text(source)
        subprocess.run([nvcc, "-arch=sm_90", "-cubin", "-std=c++17", "-O3", *options, "-o",
                        str(cubin), str(path)], check=True, capture_output=True, text=True)
        return cubin.read_bytes()


def disassemble(cubin: bytes, kernel: str, tool: str) -> str:
    """``kernel`` of the machine code ``cubin``, as cuobjdump lists it (cuobjdump runs nvdisasm,
    which it looks for beside itself, on PATH or at ``$NVDISASM_PATH``)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        done = subprocess.run([tool, "-sass", "-fun", kernel, file.name], capture_output=True,
                              text=True)
    if done.returncode:
        raise RuntimeError(f"{tool}: {done.stderr.strip()}")
    return done.stdout


def source_at(revision: str | None, name: str) -> str:
    """``gln/kernels/<name>`` as it is here, or at git ``revision``."""
    if revision is None:
        return (KERNELS / name).read_text()
    return subprocess.run(["git", "show", f"{revision}:gln/kernels/{name}"], cwd=REPOSITORY,
                          check=True, capture_output=True, text=True).stdout


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="layer_pass.cu", help="a file of gln/kernels")
    parser.add_argument("--define", action="append", default=None,
                        help="a macro, as NAME=VALUE (default: GLN_PER_LANE=25, MNIST's first "
                             "layer)")
    parser.add_argument("--kernel", action="append", default=None,
                        help=f"a kernel to list (default: {', '.join(LAYER_KERNELS)})")
    parser.add_argument("--compare", metavar="REV", help="a git revision to list first")
    parser.add_argument("--min-instructions", type=int, default=30)
    args = parser.parse_args(argv)

    defines = args.define if args.define is not None else ["GLN_PER_LANE=25"]
    tool = cuobjdump()
    revisions = [args.compare, None] if args.compare else [None]
    cubins = {revision: compiled(source_at(revision, args.source), defines)
              for revision in revisions}
    for kernel in args.kernel or LAYER_KERNELS:
        for revision in revisions:
            sass = disassemble(cubins[revision], kernel, tool)
            for loop in loops(sass, args.min_instructions):
                print(json.dumps({"benchmark": "kernel_sass", "source": args.source,
                                  "revision": revision or "working tree", "defines": defines,
                                  "kernel": kernel, **loop}), flush=True)


if __name__ == "__main__":
    main()
