"""What the compiler made of a kernel, read without a GPU: SASS opcodes, registers, stack and spills.

A compile with a ``dump_dir`` keeps its cubin (``--keep-cubin``); ``nvdisasm -c`` (wheel ``nvidia-cuda-nvdisasm``)
disassembles it and ``cuobjdump --dump-resource-usage`` (wheel ``nvidia-cuda-cuobjdump``) reports registers and
stack. Register spills to local memory show as ``STL`` / ``LDL`` instructions. `inspect_variants` compiles many
(config, arch) pairs in parallel worker processes; `flashcute check` and tests/test_compile.py use it.
"""

from __future__ import annotations

import bisect
import dataclasses
import multiprocessing
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

# `/*0a40*/  @!P0 LDGSTS.E.BYPASS.LTC128B.128 [R3], desc[UR4][R4.64] ;` -> "LDGSTS.E.BYPASS.LTC128B.128"
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?\w+\s+)?([A-Z][A-Z0-9_.]*)", re.MULTILINE)
_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+)")
# `.L_x_12:` a label, `/*0a40*/` an instruction's address, `@P0 BRA `(.L_x_12) ;` a branch to the label
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_ADDRESS = re.compile(r"^\s*/\*([0-9a-f]+)\*/")
_BRANCH = re.compile(r"\bBRA\s+`?\(?(\.L_x_\d+)")
_SM = re.compile(r"EF_CUDA_SM(\d+)\b")
_TARGET = re.compile(r"^\s*\.target\s+(sm_\w+)", re.MULTILINE)


@dataclass(frozen=True)
class SassReport:
    """One compiled kernel as the hardware sees it.

    arch:        the target the cubin was built for, as its disassembly names it ("sm_80", "sm_90a")
    registers:   registers per thread (255 is the most a thread can have)
    stack_bytes: local-memory stack per thread; more than 0 means the kernel spills or keeps arrays in memory
    opcodes:     how many instructions of each opcode-with-modifiers, e.g. {"HMMA.16816.F32.BF16": 768, ...}
    loops:       instructions in each innermost loop, largest first (step_loops): the main loops' steps
    loop_opcodes: the opcodes (without modifiers) of each of those loops and how many, in the same order
    seconds:     how long the compile took
    """

    arch: str
    registers: int
    stack_bytes: int
    opcodes: dict[str, int]
    loops: tuple[int, ...] = ()
    loop_opcodes: tuple[dict[str, int], ...] = ()
    seconds: float = 0.0

    def count(self, opcode: str) -> int:
        """Instructions whose opcode is ``opcode`` or extends it: count("LDSM") includes "LDSM.16.MT88.4"."""
        return sum(n for name, n in self.opcodes.items() if name == opcode or name.startswith(opcode + "."))

    @property
    def spills(self) -> int:
        """Local-memory stores and loads (STL, LDL): register spills."""
        return self.count("STL") + self.count("LDL")

    @property
    def instructions(self) -> int:
        return sum(self.opcodes.values())


def tool(name: str) -> Path:
    """Path of a CUDA binary tool shipped in an ``nvidia-cuda-*`` wheel (nvdisasm, cuobjdump), else from PATH."""
    try:
        import nvidia

        roots = [Path(p) for p in nvidia.__path__]
    except ImportError:
        roots = []
    for root in roots:
        found = sorted(path for path in root.glob(f"*/bin/{name}") if path.is_file())
        if found:
            return found[-1]
    on_path = shutil.which(name)
    if on_path is None:
        raise FileNotFoundError(f"{name} not found: pip install nvidia-cuda-{name} (or put the CUDA toolkit on PATH)")
    return Path(on_path)


def _run(name: str, *args: str) -> str:
    return subprocess.run([str(tool(name)), *args], check=True, capture_output=True, text=True).stdout


def dsl_toolkit() -> int:
    """The CUDA major version (12, 13) of the DSL's compiler flavor in use. With both flavors installed
    (nvidia-cutlass-dsl[cu13]) the DSL takes the newest the driver supports, the newest without a driver; ptxas
    comes with the flavor, and its SASS differs in detail between them (register allocation, spills, schedule)."""
    import cutlass  # noqa: F401 (loads the flavor)

    library = sys.modules["cutlass._mlir._mlir_libs._cutlass_ir"].__file__
    found = re.search(r"_cutlass_ir\.cu(\d+)\.", Path(library).name)
    if found is None:
        raise RuntimeError(f"cannot tell the CUDA flavor of the CuTe DSL from {library}")
    return int(found.group(1))


def _target_arch(sass: str) -> str | None:
    """The target of a disassembled cubin ("sm_80", "sm_90a"): nvdisasm prints a ``.target`` line for the ELF
    layout of CUDA 13 toolchains and the ELF header flags (``.headerflags``, EF_CUDA_SM90, EF_CUDA_ACCELERATORS
    for the "a" targets) for the older layout of CUDA 12 ones."""
    target = _TARGET.search(sass)
    if target is not None:
        return target.group(1)
    header = next((line for line in sass.splitlines() if ".headerflags" in line), "")
    sm = _SM.search(header)
    return None if sm is None else f"sm_{sm.group(1)}{'a' if 'EF_CUDA_ACCELERATORS' in header else ''}"


def innermost_loops(sass: str) -> list[list[str]]:
    """The instruction lines of each innermost loop of an ``nvdisasm -c`` listing, largest first. A loop is the
    span from a label to the last branch back to it; an innermost one holds no other. A kernel's main loops are its
    largest innermost loops, one step an iteration (the same loops a profiler's source view shows)."""
    labels, addresses, lines, pending, ends = {}, [], [], [], {}
    for line in sass.splitlines():
        if label := _LABEL.match(line):
            pending.append(label.group(1))
        elif address := _ADDRESS.match(line):
            addresses.append(int(address.group(1), 16))
            lines.append(line)
            labels.update(dict.fromkeys(pending, addresses[-1]))
            pending = []
            branch = _BRANCH.search(line)
            target = labels.get(branch.group(1)) if branch else None
            if target is not None and target <= addresses[-1]:  # a label seen already: a branch back
                ends[target] = addresses[-1]
    spans = list(ends.items())
    inner = [(a, b) for a, b in spans if not any((a, b) != (c, d) and a <= c and d <= b for c, d in spans)]
    bodies = [lines[bisect.bisect_left(addresses, a) : bisect.bisect_right(addresses, b)] for a, b in inner]
    return sorted(bodies, key=len, reverse=True)


def step_loops(sass: str) -> tuple[int, ...]:
    """Instructions in each innermost loop (innermost_loops), largest first."""
    return tuple(len(body) for body in innermost_loops(sass))


def inspect_cubin(cubin: Path) -> SassReport:
    """Disassemble a cubin holding one kernel and read its registers, stack and opcode counts."""
    sass = _run("nvdisasm", "-c", str(cubin))
    usage = [
        tuple(map(int, match)) for match in _RESOURCES.findall(_run("cuobjdump", "--dump-resource-usage", str(cubin)))
    ]
    if len(usage) != 1:
        raise ValueError(f"{cubin} holds {len(usage)} kernels, expected one")
    arch = _target_arch(sass)
    if arch is None:
        raise ValueError(f"neither a .target line nor an EF_CUDA_SM flag in the disassembly of {cubin}")
    (registers, stack_bytes), opcodes = usage[0], Counter(_INSTRUCTION.findall(sass))
    loops = innermost_loops(sass)
    loop_opcodes = tuple(
        dict(Counter(m.group(1).split(".")[0] for m in map(_INSTRUCTION.match, body) if m)) for body in loops
    )
    return SassReport(arch, registers, stack_bytes, dict(opcodes), tuple(map(len, loops)), loop_opcodes)


def machine_code(cubin: Path) -> str:
    """The instructions of a cubin's disassembly, one a line, without their addresses, labels or directives: what
    two builds that should generate the same code are compared by."""
    lines = (line.strip() for line in _run("nvdisasm", "-c", str(cubin)).splitlines())
    code = (line for line in lines if line and not line.startswith(("//", ".")))
    return "\n".join(re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).strip() for line in code)


def compile_and_inspect(config, arch: str, dump_dir: Path) -> SassReport:
    """Compile the kernel for ``config`` and ``arch`` into ``dump_dir`` (emptied first) and inspect it."""
    from flashcute.kernels.registry import compile_any

    shutil.rmtree(dump_dir, ignore_errors=True)
    start = time.perf_counter()
    compile_any(config, arch, dump_dir)
    seconds = time.perf_counter() - start
    (cubin,) = dump_dir.glob("*.cubin")
    return dataclasses.replace(inspect_cubin(cubin), seconds=seconds)


def inspect_variants(
    variants: Sequence[tuple[object, str]], dump_root: Path, jobs: int
) -> list[SassReport | Exception]:
    """`compile_and_inspect` each (config, arch) in ``jobs`` worker processes; a failed compile gives its exception.

    The workers are spawned, not forked (the parent may hold torch's threads), and each compile names its target
    explicitly (``--gpu-arch``), so one worker can build for several targets; `SassReport.arch` shows which one
    each cubin is really for.
    """
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=context) as pool:
        futures = [
            pool.submit(compile_and_inspect, config, arch, dump_root / f"{arch}-{config.label}")
            for config, arch in variants
        ]
        return [future.exception() or future.result() for future in futures]
