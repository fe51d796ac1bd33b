"""Inspect what a kernel compiles to (PTX, CUBIN, SASS and a resource summary) with no GPU: most
performance questions (tensor-core instructions, spills, registers) are answered by the compiler's
output.  Registers and stack frames come from the cubin's ``.nv.info`` attributes, static shared
memory from its ``.nv.shared.<kernel>`` sections (both need nothing but the cubin), spills and
instruction mixes from the SASS, which needs ``nvdisasm``: the ``nvidia-cuda-nvdisasm`` wheel (the
``test`` extra) or a CUDA toolkit's ``bin/`` on ``PATH``.  Without it the SASS-reading path raises
:class:`NvdisasmNotFound` (a ``RuntimeError``) rather than report no spills; ``inspect_builder(...,
sass=False)`` gives the cubin facts alone, and then ``spills`` / ``instructions`` are not available.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..common import jit

#: SASS opcodes worth counting in a Hopper kernel.
COUNTED = (
    "HGMMA", "QGMMA", "HMMA", "UTMALDG", "UTMASTG", "UTMAREDG", "UBLKCP", "LDGSTS", "STSM", "LDSM",
    "LDG", "STG", "LDS", "STS", "LDL", "STL", "BAR", "SYNCS", "FFMA", "MUFU", "SHFL",
)


NVDISASM_HINT = ("install the nvidia-cuda-nvdisasm wheel (`pip install nvidia-cuda-nvdisasm`, part of "
                 "cute_kernels' `test` extra) or put a CUDA toolkit's bin/ directory (which has nvdisasm) on PATH")


class NvdisasmNotFound(RuntimeError):
    """The SASS was asked for (spills, instruction counts) and ``nvdisasm`` is not installed."""


class SassNotRead(RuntimeError):
    """A SASS fact (spills, instruction counts) of a report made with ``inspect_builder(..., sass=False)``."""


@dataclass
class KernelResources:
    name: str
    registers: int
    static_smem: int
    stack_frame: int = 0
    #: SASS opcode counts; None when the SASS was not read (``inspect_builder(..., sass=False)``)
    instructions: Counter | None = None

    def _sass_counts(self) -> Counter:
        if self.instructions is None:
            raise SassNotRead(f"{self.name}: the SASS was not read (inspect_builder(..., sass=False)), so its "
                              "spills and instruction counts are unknown")
        return self.instructions

    @property
    def spills(self) -> int:
        """Local-memory loads + stores in SASS (spills or stack arrays; should be 0).  Raises
        :class:`SassNotRead` when the SASS was not read: never a vacuous 0."""
        counts = self._sass_counts()
        return counts["LDL"] + counts["STL"]


@dataclass
class CompileReport:
    ptx: str | None
    cubin: bytes | None
    sass: str | None
    kernels: list[KernelResources]

    def summary(self) -> str:
        lines = []
        for k in self.kernels:
            head = f"{k.name[:60]}: {k.registers} regs, static smem {k.static_smem} B, stack {k.stack_frame} B"
            if k.instructions is None:
                lines.append(f"{head}; SASS not read")
                continue
            ins = ", ".join(f"{op} {k.instructions[op]}" for op in COUNTED if k.instructions[op])
            lines.append(f"{head}, local-memory ops {k.spills}; {ins}")
        return "\n".join(lines)


def nvdisasm_path() -> str | None:
    """``nvdisasm`` on PATH, else the one of the ``nvidia-cuda-nvdisasm`` wheel, else None."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia  # namespace package of the nvidia-cuda-nvdisasm wheel

        for root in nvidia.__path__:
            for cand in Path(root).glob("cu*/bin/nvdisasm"):
                return str(cand)
    except ImportError:
        pass
    return None


def _elf_sections(blob: bytes):
    """(name, sh_info, offset, size) of each section of a 64-bit little-endian ELF."""
    if blob[:4] != b"\x7fELF" or blob[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    (shoff,) = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize) for i in range(shnum)]
    stroff = heads[shstrndx][4]

    def name(off):
        return blob[stroff + off : blob.index(b"\0", stroff + off)].decode()

    return [(name(h[0]), h[7], h[4], h[5]) for h in heads]


_EIATTR_FRAME_SIZE, _EIATTR_REGCOUNT = 0x11, 0x2F


def _nv_info_attrs(blob: bytes, off: int, size: int):
    """Yield (attribute, payload) of an ``.nv.info`` section (format byte 4 = sized payload)."""
    end = off + size
    while off < end:
        fmt, attr = blob[off], blob[off + 1]
        if fmt == 4:
            (n,) = struct.unpack_from("<H", blob, off + 2)
            yield attr, blob[off + 4 : off + 4 + n]
            off += 4 + n
        else:
            yield attr, blob[off + 2 : off + 4]
            off += 4


def cubin_resources(cubin: bytes) -> list[KernelResources]:
    """Registers (EIATTR_REGCOUNT), stack frame and static shared memory of each kernel in a cubin."""
    secs = _elf_sections(cubin)
    regs, frame = {}, {}
    for n, _, off, size in secs:
        if n == ".nv.info":
            for attr, payload in _nv_info_attrs(cubin, off, size):
                if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and len(payload) == 8:
                    sym, val = struct.unpack("<II", payload)
                    (regs if attr == _EIATTR_REGCOUNT else frame)[sym] = val
    smem = {n[len(".nv.shared."):]: size for n, _, _, size in secs if n.startswith(".nv.shared.")}
    out = []
    for n, info, _, _ in secs:
        if n.startswith(".text."):
            k = n[len(".text."):]
            sym = info & 0xFFFFFF
            out.append(KernelResources(k, regs.get(sym, 0), smem.get(k, 0), frame.get(sym, 0)))
    return out


def disassemble(cubin: bytes) -> str:
    """The SASS of ``cubin`` (``nvdisasm -c``); raises :class:`NvdisasmNotFound` without nvdisasm."""
    tool = nvdisasm_path()
    if tool is None:
        raise NvdisasmNotFound(f"nvdisasm not found: the SASS (spills, instruction counts) cannot be read; {NVDISASM_HINT}")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-c", f.name], check=True, capture_output=True, text=True).stdout


_OPCODE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_SECTION = re.compile(r"^\s*\.text\.([\w$.]+):")


def count_sass(sass: str) -> dict[str, Counter]:
    """Opcode counts per kernel (each kernel's SASS starts at a ``.text.<name>:`` label)."""
    per: dict[str, Counter] = {}
    cur = per.setdefault("", Counter())
    for line in sass.splitlines():
        m = _SECTION.match(line)
        if m:
            cur = per.setdefault(m.group(1), Counter())
            continue
        m = _OPCODE.match(line)
        if m:
            cur[m.group(1).split(".")[0]] += 1
    return per


_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_INSTR = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?);")


def wgmma_loop_bodies(sass: str) -> list[list[str]]:
    """The instructions (predicates stripped) of each innermost loop -- a backward branch -- that issues an
    HGMMA, in code order (innermost among those: a spin-wait loop inside one does not count)."""
    labels, ins = {}, []
    for line in sass.splitlines():
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = _INSTR.match(line)
        if m:
            ins.append(re.sub(r"^@!?U?P\w+\s+", "", m.group(1).strip()))
    spans = []
    for i, t in enumerate(ins):
        m = re.search(r"\bBRA\b.*?(\.L_x_\d+)", t)
        if m and m.group(1) in labels and labels[m.group(1)] <= i:
            spans.append((labels[m.group(1)], i))
    spans = [(a, b) for a, b in spans if any(x.startswith("HGMMA") for x in ins[a:b + 1])]
    return [ins[a:b + 1] for a, b in spans
            if not any(a <= a2 and b2 <= b and (a2, b2) != (a, b) for a2, b2 in spans)]


def exp2_under_gemm(body: list[str]) -> tuple[int, int, int] | None:
    """For a wgmma loop's instructions: ``(between, ex2_between, ex2_all)`` -- the instructions between its
    first ``WARPGROUP.DEPBAR.LE gsb0, 0x1`` (the first GEMM done, the next one in flight) and the wait after
    it, and how many of the loop's MUFU.EX2 ptxas scheduled there: the exponentials that overlap the
    in-flight GEMM (ptxas moves ALU work past a wgmma wait freely; an EX2 after the wait waits for the
    GEMM).  None without such a pair of waits."""
    waits = [k for k, b in enumerate(body) if b.startswith("WARPGROUP.DEPBAR")]
    first = next((k for k in waits if body[k].rstrip().endswith("0x1")), None)
    later = [k for k in waits if first is not None and k > first]
    if not later:
        return None
    nxt = later[0]
    ex2 = [k for k, b in enumerate(body) if b.startswith("MUFU.EX2")]
    return nxt - first - 1, sum(first < k < nxt for k in ex2), len(ex2)


def inspect_builder(builder: jit.Builder, sass: bool = True) -> CompileReport:
    """Compile (uncached) with PTX and CUBIN kept, disassemble, and summarize.

    ``sass=True`` (default): the SASS is read, every kernel gets its instruction counts (``spills``), and
    a missing ``nvdisasm`` raises :class:`NvdisasmNotFound` instead of a report without spills.
    ``sass=False``: the cubin facts only (registers, stack frame, static shared memory), no nvdisasm
    needed; ``spills`` then raises :class:`SassNotRead`."""
    if sass and nvdisasm_path() is None:  # before a compile of seconds
        raise NvdisasmNotFound(f"inspect_builder: nvdisasm not found, so spills and instruction counts cannot be "
                               f"read; {NVDISASM_HINT} (or call inspect_builder(..., sass=False) for registers "
                               "and shared memory only)")
    with tempfile.TemporaryDirectory() as tmp:
        compiled = jit.compile_now(builder, extra_options=f"--keep-ptx --keep-cubin --dump-dir {tmp}")
        ptx, cubin = compiled.__ptx__, compiled.__cubin__
    if not cubin:
        raise RuntimeError("inspect_builder: the compile kept no CUBIN (--keep-cubin), nothing to inspect")
    kernels = cubin_resources(cubin)
    text = None
    if sass:
        text = disassemble(cubin)
        counts = count_sass(text)
        for k in kernels:
            if k.name not in counts:
                raise RuntimeError(f"inspect_builder: kernel {k.name} of the cubin has no .text section in the SASS "
                                   "(nvdisasm output not understood)")
            k.instructions = counts[k.name]
    return CompileReport(ptx=ptx, cubin=cubin, sass=text, kernels=kernels)

