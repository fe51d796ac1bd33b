"""Inspect what a kernel compiles to (PTX, CUBIN, SASS and a resource summary) with no GPU: most
performance questions (tensor-core instructions, spills, registers) are answered by the compiler's
output.  Registers and stack frames come from the cubin's ``.nv.info`` attributes, static shared
memory from its ``.nv.shared.<kernel>`` sections, spills and instruction mixes from ``nvdisasm``.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..common import jit

#: SASS opcodes worth counting in a Hopper kernel.
COUNTED = (
    "HGMMA", "QGMMA", "HMMA", "UTMALDG", "UTMASTG", "UBLKCP", "LDGSTS", "STSM", "LDSM",
    "LDG", "STG", "LDS", "STS", "LDL", "STL", "BAR", "SYNCS", "FFMA", "MUFU", "SHFL",
)


@dataclass
class KernelResources:
    name: str
    registers: int
    static_smem: int
    stack_frame: int = 0
    instructions: Counter = field(default_factory=Counter)

    @property
    def spills(self) -> int:
        """Local-memory loads + stores in SASS (spills or stack arrays; should be 0)."""
        return self.instructions["LDL"] + self.instructions["STL"]


@dataclass
class CompileReport:
    ptx: str | None
    cubin: bytes | None
    sass: str | None
    kernels: list[KernelResources]

    def summary(self) -> str:
        lines = []
        for k in self.kernels:
            ins = ", ".join(f"{op} {k.instructions[op]}" for op in COUNTED if k.instructions[op])
            lines.append(
                f"{k.name[:60]}: {k.registers} regs, static smem {k.static_smem} B, "
                f"stack {k.stack_frame} B, local-memory ops {k.spills}; {ins}"
            )
        return "\n".join(lines)


def nvdisasm_path() -> str | None:
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


def disassemble(cubin: bytes) -> str | None:
    tool = nvdisasm_path()
    if tool is None:
        return None
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


def inspect_builder(builder: jit.Builder) -> CompileReport:
    """Compile (uncached) with PTX and CUBIN kept, disassemble, and summarize."""
    with tempfile.TemporaryDirectory() as tmp:
        compiled = jit.compile_now(builder, extra_options=f"--keep-ptx --keep-cubin --dump-dir {tmp}")
        ptx, cubin = compiled.__ptx__, compiled.__cubin__
    kernels = cubin_resources(cubin) if cubin else []
    sass = disassemble(cubin) if cubin else None
    if sass:
        counts = count_sass(sass)
        for k in kernels:
            k.instructions = counts.get(k.name, Counter())
    return CompileReport(ptx=ptx, cubin=cubin, sass=sass, kernels=kernels)

