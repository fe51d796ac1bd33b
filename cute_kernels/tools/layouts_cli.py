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
import os
import sys
from typing import Any, Callable, Sequence

from layouts import explore, raster, render, tiles

import cutlass.cute as cute  # noqa: E402  (after layouts: it sets the DSL arch first)

from .args import MAX_DIM, OneLineParser, check_fits, gemm_bytes, int_in, one_line

WHATS = ("mma-c", "mma-a", "mma-b", "smem-a", "smem-b", "smem-epi", "banks", "raster", "layout")
#: the most work tiles a raster draws (a 32768 x 32768 output in 128 x 128 tiles, about 20 s and 1 GB
#: of host memory to draw), counting the scheduler's padding units
MAX_RASTER_TILES = 2**16
#: the most elements a --layout may have (its table is drawn cell by cell)
MAX_LAYOUT_SIZE = 2**16
#: the file types --out writes, by extension
OUT_FORMATS = {".txt": "text", ".svg": "svg", ".png": "png"}


def _ints(n: int, hi: int) -> Callable[[str], tuple[int, ...]]:
    """An argparse ``type``: ``n`` comma-separated integers, each in 1..``hi``."""

    def parse(s: str) -> tuple[int, ...]:
        try:
            v = tuple(int(x) for x in s.replace("x", ",").split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {n} comma-separated integers, got {s!r}") from None
        if len(v) != n:
            raise argparse.ArgumentTypeError(f"expected {n} comma-separated integers, got {s!r}")
        if min(v) < 1:
            raise argparse.ArgumentTypeError(f"expected positive integers (in 1..{hi}), got {s!r}")
        if max(v) > hi:
            raise argparse.ArgumentTypeError(f"expected integers in 1..{hi}, got {s!r}")
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
            shape, stride = ast.literal_eval(s.strip()), None
        else:
            shape, stride = ast.literal_eval(s[:split].strip()), ast.literal_eval(s[split + 1 :].strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise argparse.ArgumentTypeError(f"cannot parse layout {s!r}; expected e.g. '(4,8):(8,1)'") from None
    size = _layout_size(shape)
    if size is None:
        raise argparse.ArgumentTypeError(f"layout {s!r}: the shape must be positive integers, nested in tuples")
    if size > MAX_LAYOUT_SIZE:
        raise argparse.ArgumentTypeError(f"layout {s!r} has {size} elements; at most {MAX_LAYOUT_SIZE} are drawn")
    return shape, stride


def _layout_size(shape: Any) -> int | None:
    """Elements of a (nested) shape of positive ints; None for anything else."""
    if isinstance(shape, int) and not isinstance(shape, bool):
        return shape if shape >= 1 else None
    if isinstance(shape, tuple) and shape:
        sizes = [_layout_size(x) for x in shape]
        return None if None in sizes else math.prod(sizes)
    return None


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
        _check_raster_size(nt, t.cluster_mn, a.swizzle)
        table = raster.cta_raster_order(nt, t.cluster_mn, a.swizzle, a.raster == "m", a.num_ctas)
        return table, {"by": a.color or "cta"}
    if w == "layout":
        if a.layout is None:  # the accumulator's TV layout itself, (thread, value) -> index in the tile
            return explore.evaluate(lambda: tiles.make_tiled_mma(t.mma).tv_layout_C), {"color": "offset"}
        shape, stride = a.layout
        return explore.evaluate(lambda: cute.make_layout(shape, stride=stride)), {}
    raise AssertionError(w)


def _check_raster_size(num_tiles_mn: tuple[int, int], cluster_mn: tuple[int, int], swizzle: int) -> None:
    """ValueError before the scheduler is traced when the raster has more than :data:`MAX_RASTER_TILES`
    work tiles, counting the padding units a swizzle adds (cluster rows rounded up to whole strips)."""
    mc, nc = (-(-t // c) for t, c in zip(num_tiles_mn, cluster_mn))
    units = max(-(-mc // swizzle) * swizzle * nc, mc * -(-nc // swizzle) * swizzle) * cluster_mn[0] * cluster_mn[1]
    if units > MAX_RASTER_TILES:
        raise ValueError(f"raster of {num_tiles_mn[0]}x{num_tiles_mn[1]} tiles (up to {units} work tiles with "
                         f"swizzle {swizzle}): at most {MAX_RASTER_TILES} are drawn; a smaller --problem or a "
                         "larger --tile")


KERNELS: dict[str, Callable[[argparse.Namespace], tuple[Any, dict]]] = {"gemm": _gemm}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="cute-kernels layouts",
        description="Show a kernel's MMA fragments, shared-memory layouts/banks and tile order, on the CPU.  "
                    f"Bounds: --problem and --plan sizes at most 2^31 - 1, --plan's bf16 a, b and output within an "
                    f"H200's memory, at most {MAX_RASTER_TILES} raster work tiles and {MAX_LAYOUT_SIZE} --layout "
                    "elements.",
        epilog="examples:\n" + __doc__.split("Examples::", 1)[1].rstrip().rstrip('"'),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("kernel", choices=tuple(KERNELS), help=f"kernel name ({', '.join(KERNELS)})")
    p.add_argument("--what", choices=WHATS, default="mma-c",
                   help="mma-c/a/b: thread ownership of a wgmma operand; smem-a/b/epi: one stage of the "
                        "swizzled smem tile (offsets, coloured by bank group); banks: bank group per 16B "
                        "chunk (--operand); raster: persistent scheduler tile order; layout: --layout or "
                        "the C TV layout (default: mma-c)")
    p.add_argument("--tile", type=_ints(3, 256), help="CTA tile M,N,K, each 1..256 (default 128,256,64)")
    p.add_argument("--atom-n", type=int_in(8, 256), help="N of one wgmma instruction, 8..256 (default 128)")
    p.add_argument("--warpgroups", type=_ints(2, 4), help="consumer warpgroups M,N, each 1..4 (default 2,1)")
    p.add_argument("--cluster", type=_ints(2, 16), help="cluster shape M,N, each 1..16 (default 1,1)")
    p.add_argument("--stages", type=int_in(1, 16), help="A/B pipeline stages, 1..16 (default 4)")
    p.add_argument("--dtype", choices=sorted(k for k in tiles.DTYPE_NAMES if k != "float32"), help="A/B/C element type")
    p.add_argument("--a-major", choices=("k", "mn"), help="A tile stored K-major or M-major (default k)")
    p.add_argument("--b-major", choices=("k", "mn"), help="B tile stored K-major or N-major (default k)")
    p.add_argument("--tiled", action="store_true", help="mma-*: the whole tiled MMA instead of one atom")
    p.add_argument("--operand", default="a", choices=("a", "b", "c", "epi"), help="banks: which smem tile")
    p.add_argument("--stage", type=int_in(0, 15), default=0, help="smem-*/banks: pipeline stage, below --stages")
    p.add_argument("--problem", type=_ints(2, MAX_DIM),
                   help=f"raster: problem M,N (default 4096,4096, or --plan's); at most {MAX_RASTER_TILES} "
                        "work tiles are drawn")
    p.add_argument("--num-ctas", type=int_in(1, 1024), default=132,
                   help="raster: persistent CTAs, 1..1024 (default 132 = SMs)")
    p.add_argument("--swizzle", type=int_in(1),
                   help="raster: group width for L2 reuse (default 1, or --plan's); the padding units it adds "
                        "count towards the work-tile bound")
    p.add_argument("--raster", choices=("m", "n"), help="raster: direction (default m, or --plan's)")
    p.add_argument("--plan", type=_ints(3, MAX_DIM), help="M,N,K: start from the tiles, cluster and raster that "
                                                          "cute_kernels.gemm runs for this bf16 problem")
    p.add_argument("--color", choices=("cta", "wave", "order"), help="raster: colour key (default cta)")
    p.add_argument("--layout", type=_layout_spec, help="layout: 'SHAPE:STRIDE', e.g. '(4,8):(8,1)'")
    p.add_argument("--format", choices=render.FORMATS, help="text, svg or png (default: from --out, else text)")
    p.add_argument("--out", help="write to this file (.txt, .svg or .png) instead of stdout")
    return p


def _out_format(p: argparse.ArgumentParser, a: argparse.Namespace) -> str:
    """The format to write: --format, else --out's extension, else text; an --out of another type, or
    one whose extension --format contradicts, is a usage error (nothing would read the file back)."""
    if not a.out:
        if a.format == "png":
            p.error("--format png needs --out FILE")
        return a.format or "text"
    ext = os.path.splitext(a.out)[1].lower()
    if ext not in OUT_FORMATS:
        p.error(f"--out {a.out}: writes {', '.join(OUT_FORMATS)} files ({', '.join(OUT_FORMATS.values())})")
    if a.format and a.format != OUT_FORMATS[ext]:
        p.error(f"--format {a.format} does not match --out {a.out} ({OUT_FORMATS[ext]})")
    return OUT_FORMATS[ext]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; ``argv`` are the arguments after ``cute-kernels layouts``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["layouts"]:
        argv = argv[1:]
    p = build_parser()
    a = p.parse_args(argv)
    fmt = _out_format(p, a)
    if a.plan is not None:
        try:
            check_fits(f"--plan {','.join(map(str, a.plan))}: bf16 a, b and the output", gemm_bytes(*a.plan, None, 2, 2, False))
        except ValueError as e:
            p.error(str(e))
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
