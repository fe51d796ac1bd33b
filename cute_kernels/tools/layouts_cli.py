"""``cute-kernels layouts <kernel> ...``: print or draw a kernel's layouts without a GPU.

Examples::

    cute-kernels layouts gemm                                # accumulator fragment, text
    cute-kernels layouts gemm --what smem-a --out smem_a.svg
    cute-kernels layouts gemm --what banks --operand b
    cute-kernels layouts gemm --what raster --problem 8192,8192 --num-ctas 132 --swizzle 4 --out r.png
    cute-kernels layouts gemm --what layout --layout "((4,8),2):((16,1),8)"
    cute-kernels layouts gemm --what raster --plan 4096,4096,4096 --out r.svg   # what gemm() runs
"""

from __future__ import annotations

import argparse
import ast
import math
import sys
from typing import Any, Callable, Sequence

from layouts import explore, raster, render, tiles

import cutlass.cute as cute  # noqa: E402  (after layouts: it sets the DSL arch first)

from .args import OneLineParser, int_in, one_line

WHATS = ("mma-c", "mma-a", "mma-b", "smem-a", "smem-b", "smem-epi", "banks", "raster", "layout")


def _ints(n: int) -> Callable[[str], tuple[int, ...]]:
    def parse(s: str) -> tuple[int, ...]:
        try:
            v = tuple(int(x) for x in s.replace("x", ",").split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {n} comma-separated integers, got {s!r}") from None
        if len(v) != n:
            raise argparse.ArgumentTypeError(f"expected {n} comma-separated integers, got {s!r}")
        if min(v) < 1:
            raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
        return v

    return parse


def _layout_spec(s: str) -> tuple[Any, Any]:
    """``'(4,8):(8,1)'`` -> (shape, stride); ``'(4,8)'`` -> (shape, None)."""
    depth, split = 0, None
    for i, ch in enumerate(s):
        depth += ch == "("
        depth -= ch == ")"
        if ch == ":" and depth == 0:
            split = i
    try:
        if split is None:
            return ast.literal_eval(s.strip()), None
        return ast.literal_eval(s[:split].strip()), ast.literal_eval(s[split + 1 :].strip())
    except (ValueError, SyntaxError):
        raise argparse.ArgumentTypeError(f"cannot parse layout {s!r}; expected e.g. '(4,8):(8,1)'") from None


def _apply_plan(a: argparse.Namespace) -> tiles.GemmTiles | None:
    """``--plan M,N,K``: the tiles and raster ``cute_kernels.gemm`` runs for that bf16 row-major problem
    (``cute_kernels.gemm.explain``: its real planning code, nothing compiled).  Explicit flags still win;
    the problem, swizzle (as fitted) and raster direction are filled in where not given."""
    if a.plan is None:
        return None
    from ..gemm import explain

    rows = [r for r in explain(*a.plan) if "tile_mnk" in r]
    r = next((r for r in rows if "raster" in r), rows[0] if rows else None)
    if r is None:
        raise ValueError(f"--plan {a.plan}: no GEMM kernel in that plan")
    if "raster" not in r:  # a split-K kernel (grid of (slice, tile) CTAs): its tiles, but no raster to draw
        if a.what == "raster":
            raise ValueError(f"--plan {a.plan}: that problem runs a split-K kernel ({r['kernel']}), "
                             "which has no persistent raster")
        return r["config"].tiles
    if a.problem is None:
        a.problem = a.plan[:2]
    if a.swizzle is None:
        a.swizzle = r["raster"][0]
    if a.raster is None:
        a.raster = r["raster"][1].lower()
    return r["config"].tiles


def _gemm_tiles(a: argparse.Namespace) -> tiles.GemmTiles:
    d = _apply_plan(a) or tiles.GemmTiles()
    a.problem = a.problem or (4096, 4096)
    a.swizzle = a.swizzle or 1
    a.raster = a.raster or "m"
    mma = tiles.MmaTile(
        ab_dtype=a.dtype or d.mma.ab_dtype,
        atom_n=a.atom_n or d.mma.atom_n,
        warpgroups_mn=a.warpgroups or d.mma.warpgroups_mn,
        a_major=a.a_major or d.mma.a_major,
        b_major=a.b_major or d.mma.b_major,
    )
    tile = a.tile or d.tile_mnk
    return tiles.GemmTiles(
        tile_mnk=tile,
        cluster_mn=a.cluster or d.cluster_mn,
        mma=mma,
        ab_stages=a.stages or d.ab_stages,
        epi_tile_mn=(d.epi_tile_mn[0], math.gcd(d.epi_tile_mn[1], tile[1])),  # narrow tiles (split-K 128x16)
        c_dtype=a.dtype or d.c_dtype,
    )


def _gemm(a: argparse.Namespace) -> tuple[Any, dict]:
    """The table to draw for ``--what`` and the keyword arguments of its ``grid()``."""
    t = _gemm_tiles(a)
    w = a.what
    if w.startswith("mma-"):
        return explore.mma_fragment_ownership(t.mma, w[-1].upper(), tiled=a.tiled), {}
    if w.startswith("smem-"):
        op = {"smem-a": "A", "smem-b": "B", "smem-epi": "C"}[w]
        return explore.smem_bank_pattern(t, op, a.stage), {"level": "element"}
    if w == "banks":
        return explore.smem_bank_pattern(t, a.operand, a.stage), {"level": "chunk"}
    if w == "raster":
        nt = raster.num_tiles(a.problem, t.tile_mnk[:2])
        table = raster.cta_raster_order(nt, t.cluster_mn, a.swizzle, a.raster == "m", a.num_ctas)
        return table, {"by": a.color or "cta"}
    if w == "layout":
        if a.layout is None:  # the accumulator's TV layout itself, (thread, value) -> index in the tile
            return explore.evaluate(lambda: tiles.make_tiled_mma(t.mma).tv_layout_C), {"color": "offset"}
        shape, stride = a.layout
        return explore.evaluate(lambda: cute.make_layout(shape, stride=stride)), {}
    raise AssertionError(w)


KERNELS: dict[str, Callable[[argparse.Namespace], tuple[Any, dict]]] = {"gemm": _gemm}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="cute-kernels layouts",
        description="Show a kernel's MMA fragments, shared-memory layouts/banks and tile order, on the CPU.",
        epilog="examples:\n" + __doc__.split("Examples::", 1)[1].rstrip().rstrip('"'),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("kernel", choices=tuple(KERNELS), help=f"kernel name ({', '.join(KERNELS)})")
    p.add_argument("--what", choices=WHATS, default="mma-c",
                   help="mma-c/a/b: thread ownership of a wgmma operand; smem-a/b/epi: one stage of the "
                        "swizzled smem tile (offsets, coloured by bank group); banks: bank group per 16B "
                        "chunk (--operand); raster: persistent scheduler tile order; layout: --layout or "
                        "the C TV layout (default: mma-c)")
    p.add_argument("--tile", type=_ints(3), help="CTA tile M,N,K (default 128,256,64)")
    p.add_argument("--atom-n", type=int_in(8, 256), help="N of one wgmma instruction (default 128)")
    p.add_argument("--warpgroups", type=_ints(2), help="consumer warpgroups M,N (default 2,1)")
    p.add_argument("--cluster", type=_ints(2), help="cluster shape M,N (default 1,1)")
    p.add_argument("--stages", type=int_in(1), help="A/B pipeline stages (default 4)")
    p.add_argument("--dtype", choices=sorted(k for k in tiles.DTYPES if k != "float32"), help="A/B/C element type")
    p.add_argument("--a-major", choices=("k", "mn"), help="A tile stored K-major or M-major (default k)")
    p.add_argument("--b-major", choices=("k", "mn"), help="B tile stored K-major or N-major (default k)")
    p.add_argument("--tiled", action="store_true", help="mma-*: the whole tiled MMA instead of one atom")
    p.add_argument("--operand", default="a", choices=("a", "b", "c", "epi"), help="banks: which smem tile")
    p.add_argument("--stage", type=int_in(0), default=0, help="smem-*/banks: pipeline stage")
    p.add_argument("--problem", type=_ints(2),
                   help="raster: problem M,N (default 4096,4096, or --plan's)")
    p.add_argument("--num-ctas", type=int_in(1), default=132, help="raster: persistent CTAs (default 132 = SMs)")
    p.add_argument("--swizzle", type=int_in(1), help="raster: group width for L2 reuse (default 1, or --plan's)")
    p.add_argument("--raster", choices=("m", "n"), help="raster: direction (default m, or --plan's)")
    p.add_argument("--plan", type=_ints(3), help="M,N,K: start from the tiles, cluster and raster that "
                                                 "cute_kernels.gemm runs for this bf16 problem")
    p.add_argument("--color", choices=("cta", "wave", "order"), help="raster: colour key (default cta)")
    p.add_argument("--layout", type=_layout_spec, help="layout: 'SHAPE:STRIDE', e.g. '(4,8):(8,1)'")
    p.add_argument("--format", choices=render.FORMATS, help="text, svg or png (default: from --out, else text)")
    p.add_argument("--out", help="write to this file instead of stdout")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; ``argv`` are the arguments after ``cute-kernels layouts``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["layouts"]:
        argv = argv[1:]
    p = build_parser()
    a = p.parse_args(argv)
    fmt = a.format or (render.format_from_path(a.out) if a.out else "text")
    if fmt == "png" and not a.out:
        p.error("--format png needs --out FILE")
    try:
        table, kw = KERNELS[a.kernel](a)
        if a.out:
            render.save(table, a.out, fmt, **kw)
            print(f"wrote {a.out} ({fmt})", file=sys.stderr)
        else:
            sys.stdout.write(render.render(table, fmt, **kw))
    except (ValueError, TypeError, OSError) as e:  # bad tile/atom combinations, stage out of range, --out
        p.exit(2, f"{p.prog}: error: {one_line(e)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
