"""FlashAttention-4's SM90 backward (or forward) compiled on this CPU, its main loop's instruction mix beside ours.

Why: the backward is 0.91-0.93x FlashAttention-4 on the bench's D 128 shapes (issue 33) and no GPU may be
at hand; both kernels are CuTe DSL, so both compile here for sm_90a and their SASS can be read side by
side.  For each kernel this finds the loops that issue wgmmas (a backward branch around HGMMAs: the
consumers' per-query-tile step) and prints each loop's length and the counts of the instructions that
differ in kind (shared-memory stores by width, wgmma fences and waits, mbarrier waits, MUFU, ...).

The peer comes from the device's wheels (``../shared/device/wheels``: flash_attn_4, quack_kernels),
unpacked into a scratch folder; quack's package ``__init__`` is cut to its tensor-indexing patch (the
rest imports triton, absent here), and FlashAttention-4's interface runs under torch's FakeTensorMode
with its own cross-compile switches (``FLASH_ATTENTION_ARCH``, ``FLASH_ATTENTION_NUM_SMS``), so nothing
launches.  Needs ``einops`` (``pip download einops`` is enough: put it on ``--extra-path``).

    python3 profiles/peer_sass.py [--causal] [--head-dim 128] [--forward] [--shape 4,4096,32,8]
        [--wheels ../shared/device/wheels] [--scratch /tmp/peer_sass] [--extra-path DIR] [--tile dv_early]
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import subprocess
import sys
import zipfile
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

#: instruction kinds worth comparing one by one (the rest are summed by opcode)
DETAIL = ("STS", "LDS", "STSM", "LDSM", "HGMMA", "WARPGROUP", "SYNCS", "BAR", "MUFU", "MEMBAR", "FENCE")


def wgmma_loops(sass: str, bodies: list | None = None) -> list[tuple[int, Counter, Counter]]:
    """``(length, opcode counts, detailed counts)`` of each innermost wgmma loop
    (:func:`cute_kernels.tools.inspect.wgmma_loop_bodies`); ``bodies``, if given, gets each loop's instructions."""
    from cute_kernels.tools.inspect import wgmma_loop_bodies

    loops = []
    for body in wgmma_loop_bodies(sass):
        if bodies is not None:
            bodies.append(body)
        ops = Counter(b.split()[0].split(".")[0] for b in body)
        loops.append((len(body), ops, Counter(b.split()[0] for b in body if b.split()[0].split(".")[0] in DETAIL)))
    return loops


def overlap(body: list[str]) -> str:
    """:func:`cute_kernels.tools.inspect.exp2_under_gemm` of a loop, in words."""
    from cute_kernels.tools.inspect import exp2_under_gemm

    r = exp2_under_gemm(body)
    if r is None:
        return "no S / next-GEMM wait pair"
    return f"{r[0]} instructions between the S wait and the next, {r[1]} of {r[2]} MUFU.EX2"


def peer_cubin(causal: bool, head_dim: int, wheels: str, scratch: str, extra: list[str], forward: bool = False,
               shape: tuple = (4, 4096, 32, 8)) -> bytes:
    """FlashAttention-4's SM90 backward main kernel (``forward``: its forward) for ``shape`` = (batch,
    sequence, query heads, KV heads) at ``head_dim``, bf16, compiled in a child process (its DSL arch
    switches must be set before anything imports the DSL)."""
    os.makedirs(scratch, exist_ok=True)
    for pattern in ("flash_attn_4-*.whl", "quack_kernels-*.whl"):
        whl = sorted(glob.glob(os.path.join(wheels, pattern)))
        if not whl:
            raise SystemExit(f"peer_sass: no {pattern} under {wheels}")
        with zipfile.ZipFile(whl[-1]) as z:
            z.extractall(scratch)
    with open(os.path.join(scratch, "quack", "__init__.py"), "w") as f:  # the indexing patch only
        f.write('__version__ = "peer_sass"\nimport quack.dsl as _quack_dsl  # noqa: F401\n')
    out = os.path.join(scratch, f"{'fwd' if forward else 'bwd'}_{'causal' if causal else 'full'}_d{head_dim}.cubin")
    B, S, H, Hkv = shape
    call = (f"I._flash_attn_fwd(mk(B, S, H, D), mk(B, S, Hkv, D), mk(B, S, Hkv, D), causal={causal})" if forward else
            f"I._flash_attn_bwd(*(mk(B, S, H, D) for _ in range(5)), mk(B, H, S, dt=torch.float32), causal={causal})")
    child = f"""
import os, sys
sys.path[:0] = {[scratch, *extra]!r}
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
import cutlass.cute as cute
from flash_attn.cute import interface as I
compiled = []
def keep(*a, options="", **kw):
    r = cute.__dict__["compile"](*a, options=(options + " --keep-cubin --dump-dir {scratch}").strip(), **kw)
    compiled.append(r)
    return r
I.cute = type("C", (), {{"compile": staticmethod(keep), "__getattr__": lambda s, n: getattr(cute, n)}})()
with FakeTensorMode(allow_non_fake_inputs=True):
    mk = lambda *s, dt=torch.bfloat16: torch.empty(*s, dtype=dt, device="cuda")
    B, S, H, Hkv, D = {B}, {S}, {H}, {Hkv}, {head_dim}
    {call}
main = max(compiled, key=lambda r: len(r.__cubin__ or b""))
open({out!r}, "wb").write(main.__cubin__)
"""
    env = dict(os.environ, FLASH_ATTENTION_ARCH="sm_90", CUTE_DSL_ARCH="sm_90a", FLASH_ATTENTION_NUM_SMS="132")
    subprocess.run([sys.executable, "-c", child], check=True, env=env)
    with open(out, "rb") as f:
        return f.read()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--causal", action="store_true")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--forward", action="store_true", help="the forward kernels (FA4's and ours) instead")
    p.add_argument("--shape", default="4,4096,32,8", help="batch,seqlen,heads_q,heads_kv (FA4 picks its tile by it)")
    p.add_argument("--wheels", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "device", "wheels"))
    p.add_argument("--scratch", default="/tmp/peer_sass")
    p.add_argument("--extra-path", action="append", default=[], help="a folder to import from (einops)")
    p.add_argument("--tile", default="", help="backward: BwdTile fields to set on ours, comma-separated (dv_early)")
    a = p.parse_args(argv)
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import torch

    from cute_kernels.attention import backward_kernel as bk
    from cute_kernels.attention import forward as FW
    from cute_kernels.attention import forward_kernel as FK
    from cute_kernels.tools import inspect as ins

    shape = tuple(int(x) for x in a.shape.split(","))
    peer = ins.disassemble(peer_cubin(a.causal, a.head_dim, a.wheels, a.scratch, a.extra_path, a.forward, shape))
    if a.forward:
        builder = FK.forward_builder(FW.plan(torch.bfloat16, a.head_dim, a.causal, False, False, 0, False, False))
    else:
        cfg = bk.bwd_config("bfloat16", a.head_dim, a.causal, direct_kv=shape[2] == shape[3])
        fields = {f: True for f in a.tile.split(",") if f}
        builder = bk.backward_builder(dataclasses.replace(cfg, tile=dataclasses.replace(cfg.tile, **fields)))
    ours = ins.inspect_builder(builder).sass
    for name, sass in (("FlashAttention-4", peer), ("cute_kernels", ours)):
        bodies: list = []
        for (n, ops, detail), body in zip(wgmma_loops(sass, bodies), bodies):
            print(f"{name:16s} loop of {n} instructions: HGMMA {ops['HGMMA']}, MUFU {ops['MUFU']}, FFMA {ops['FFMA']}, "
                  f"uniform {sum(v for k, v in ops.items() if k.startswith('U'))}")
            print(f"{'':16s}   {dict(sorted(detail.items()))}")
            print(f"{'':16s}   {overlap(body)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
