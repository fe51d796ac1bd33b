"""Evaluate the kernels' layouts on the CPU as plain Python tables.

Every number comes from the DSL's own layout algebra, evaluated inside a host-side ``@cute.jit`` trace
(static layouts fold to Python ints there).  One piece of hardware knowledge is added: the GMMA smem
atoms' swizzle (``S<3,4,3> o 0 o layout``) is attached to the *pointer*, so it acts on **byte**
addresses while the layout counts elements (CuTe C++ ``swizzle_ptr``); :func:`evaluate` with
``elem_bytes`` and :func:`smem_bank_pattern` apply it that way.

The tables (:class:`LayoutTable`, :class:`OwnershipTable`, :class:`BankTable`, and
:class:`~layouts.raster.RasterTable`) are frozen dataclasses of ints whose ``grid()`` returns a
:class:`Grid` that :mod:`layouts.render` draws as text, SVG or PNG.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .target import set_dsl_arch_env

set_dsl_arch_env()

import cutlass.cute as cute  # noqa: E402

from . import tiles as _tiles  # noqa: E402

BANK_BYTES = 4  # shared memory: 32 banks of 4 bytes
NUM_BANKS = 32
CHUNK_BYTES = 16  # one 16-byte vector (4 banks): the unit the 128B swizzle permutes
CHUNKS_PER_ROW = 8  # 128 bytes = one full sweep of the 32 banks


# ---- running code inside a DSL context ----------------------------------------------------------

_pending: list[Callable[[], None]] = []
_lock = threading.RLock()  # _pending is global: one trace at a time


@cute.jit
def _trace():
    # re-traced on every call (a zero-argument host function is not cached by value)
    _pending[0]()


def in_dsl(fn: Callable[[], Any]) -> Any:
    """Run ``fn()`` inside a host-side DSL trace (the MLIR context the layout builders need) and return
    its result, which must be pure Python (DSL objects do not outlive the trace)."""
    box: list[Any] = []
    with _lock:
        _pending[:] = [lambda: box.append(fn())]
        try:
            _trace()
        finally:
            _pending.clear()
    return box[0]


def _py(x: Any) -> Any:
    """A static IntTuple as nested Python ints/tuples."""
    if isinstance(x, (tuple, list)):
        return tuple(_py(e) for e in x)
    return int(x)


def _size(shape: Any) -> int:
    return math.prod(_size(s) for s in shape) if isinstance(shape, tuple) else int(shape)


def _physical(layout: Any, coords: Sequence[Any], elem_bytes: int | None) -> list[int]:
    """Offsets of ``coords`` (element units).  A ComposedLayout with ``elem_bytes`` is treated as a
    pointer swizzle: offset = swizzle((base + outer(c)) * elem_bytes) / elem_bytes."""
    if elem_bytes is None or not isinstance(layout, cute.ComposedLayout):
        return [int(layout(c)) for c in coords]
    outer, base = layout.outer, int(layout.offset)
    raw = [(base + int(outer(c))) * elem_bytes for c in coords]
    # The swizzle functor alone, as the DSL evaluates it: S o 0 o identity over the byte range.
    on_bytes = cute.make_composed_layout(layout.inner, 0, cute.make_layout(1 << max(1, max(raw).bit_length() + 1)))
    out = []
    for b in raw:
        p = int(on_bytes(b))
        assert p % elem_bytes == 0, "swizzle moved a byte inside an element"
        out.append(p // elem_bytes)
    return out


# ---- what renderers draw ------------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    """A 2-D picture: a label and a colour key per cell (key ``None`` = blank)."""

    title: str
    labels: tuple[tuple[str, ...], ...]
    keys: tuple[tuple[int | None, ...], ...]
    num_keys: int
    key_name: str = ""
    row_name: str = "row"
    col_name: str = "col"
    notes: tuple[str, ...] = ()
    short: tuple[tuple[str, ...], ...] | None = None  # compact labels for dense pictures
    palette: str = "distinct"  # 'distinct': neighbouring keys contrast; 'ramp': key order as a hue ramp

    @property
    def rows(self) -> int:
        return len(self.labels)

    @property
    def cols(self) -> int:
        return len(self.labels[0]) if self.labels else 0


def _tuples(rows: Sequence[Sequence[Any]]) -> tuple[tuple[Any, ...], ...]:
    return tuple(tuple(r) for r in rows)


# ---- 1. any layout ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayoutTable:
    """A layout evaluated at every coordinate: ``offsets[r][c] == L(r + rows * c)``, row = mode 0,
    column = the colexicographic index over the other modes (a staged ``(M, K, stages)`` layout shows
    its stages side by side); rank-1 layouts are a column, as CuTe's ``print_layout`` draws them."""

    text: str
    shape: Any  # nested tuple (or int for rank 1)
    stride: Any  # nested tuple, None for a ComposedLayout
    offsets: tuple[tuple[int, ...], ...]
    swizzle: str | None = None  # e.g. 'S<3,4,3>' for a ComposedLayout
    elem_bytes: int | None = None  # set when the swizzle was applied to byte addresses

    @property
    def rows(self) -> int:
        return len(self.offsets)

    @property
    def cols(self) -> int:
        return len(self.offsets[0])

    def __call__(self, r: int, c: int) -> int:
        return self.offsets[r][c]

    def grid(self, color: str | None = None) -> Grid:
        """``color='bank'`` (default when ``elem_bytes`` is known): the 16-byte bank group (0..7) of
        each element; ``'offset'``: one colour per offset value."""
        color = color or ("bank" if self.elem_bytes else "offset")
        if color == "bank":
            eb = self.elem_bytes or 1
            keys = [[(o * eb // CHUNK_BYTES) % CHUNKS_PER_ROW for o in row] for row in self.offsets]
            n, kname = CHUNKS_PER_ROW, "16B bank group"
        else:
            keys = [list(row) for row in self.offsets]
            n, kname = max(max(r) for r in self.offsets) + 1, "offset"
        palette = "distinct" if color == "bank" else "ramp"
        notes = [f"layout {self.text}"]
        if self.elem_bytes:
            notes.append(f"swizzle {self.swizzle} applied to byte addresses ({self.elem_bytes} B/elem), "
                         "offsets in elements")
        return Grid(
            title=f"layout {self.text}",
            labels=_tuples([[str(o) for o in row] for row in self.offsets]),
            keys=_tuples(keys),
            num_keys=n,
            key_name=kname,
            row_name="mode 0",
            col_name="modes 1..",
            notes=tuple(notes),
            palette=palette,
        )


def evaluate(layout_factory: Callable[[], Any], *, elem_bytes: int | None = None) -> LayoutTable:
    """Evaluate the layout ``layout_factory()`` returns inside a DSL trace.  ``elem_bytes``: for a
    swizzled ComposedLayout, the placement the kernel's swizzled smem pointer produces (swizzle on bytes)."""

    def work():
        L = layout_factory()
        composed = isinstance(L, cute.ComposedLayout)
        shape = _py(cute.shape(L))
        n = _size(shape)
        rows = _size(shape[0]) if isinstance(shape, tuple) and len(shape) >= 2 else n
        flat = _physical(L, range(n), elem_bytes)
        table = [[flat[r + rows * c] for c in range(n // rows)] for r in range(rows)]
        return LayoutTable(
            text=str(L),
            shape=shape,
            stride=None if composed else _py(L.stride),
            offsets=_tuples(table),
            swizzle=str(L.inner) if composed else None,
            elem_bytes=elem_bytes if composed else None,
        )

    return in_dsl(work)


# ---- 2. who owns which MMA element --------------------------------------------------------------


@dataclass(frozen=True)
class OwnershipTable:
    """Which thread (and which of its values) holds each element of an MMA operand tile, from the TV
    layout.  ``thread[r][c]``: the lowest owning thread; ``owners[r][c]``: how many own it (1 for C; 128
    for A and B of the SS wgmma, read from smem by the whole warpgroup: thread stride 0)."""

    operand: str
    tiled: bool
    tv_layout: str
    tile_shape: tuple[int, int]  # C: (M, N); A: (M, K); B: (N, K)
    num_threads: int
    num_values: int
    thread: tuple[tuple[int, ...], ...]
    value: tuple[tuple[int, ...], ...]
    owners: tuple[tuple[int, ...], ...]

    @property
    def broadcast(self) -> bool:
        """True when elements are shared by many threads (operand read from smem, not registers)."""
        return any(o > 1 for row in self.owners for o in row)

    def elements_of(self, thread: int) -> list[tuple[int, int, int]]:
        """``(row, col, value)`` of every element ``thread`` owns (lowest owner for shared ones)."""
        M, N = self.tile_shape
        out = [(r, c, self.value[r][c]) for r in range(M) for c in range(N) if self.thread[r][c] == thread]
        return sorted(out, key=lambda e: e[2])

    def grid(self, by: str | None = None) -> Grid:
        """Colour by ``'thread'`` (default for C) or ``'value'`` (default for shared operands)."""
        by = by or ("value" if self.broadcast else "thread")
        labels, short = [], []
        for tr, vr, orow in zip(self.thread, self.value, self.owners):
            lr, sr = [], []
            for t, v, o in zip(tr, vr, orow):
                if o == 1:
                    who = str(t)
                elif o == 128 and t % 128 == 0:
                    who = f"W{t // 128}"
                else:
                    who = f"{t}+{o}"
                lr.append(f"{who}:{v}")
                sr.append(who if by == "thread" else str(v))
            labels.append(lr)
            short.append(sr)
        keys = self.thread if by == "thread" else self.value
        n = self.num_threads if by == "thread" else self.num_values
        M, N = self.tile_shape
        axes = {"C": ("m", "n"), "A": ("m", "k"), "B": ("n", "k")}[self.operand]
        notes = [f"TV layout {self.operand}: {self.tv_layout}", "cell = thread:value"]
        if self.broadcast:
            notes.append("SS wgmma: the operand stays in shared memory; every thread of the warpgroup (W#) "
                         "'owns' it (thread stride 0), value = index into the smem operand")
        return Grid(
            title=f"wgmma {self.operand} {'tiled ' if self.tiled else 'atom '}{M}x{N}: owner thread:value",
            labels=_tuples(labels),
            keys=_tuples(keys),
            num_keys=n,
            key_name=by,
            row_name=axes[0],
            col_name=axes[1],
            notes=tuple(notes),
            short=_tuples(short),
            palette="distinct" if by == "thread" else "ramp",
        )


def mma_fragment_ownership(mma: _tiles.MmaTile, operand: str = "C", *, tiled: bool = False) -> OwnershipTable:
    """Thread/value ownership of one wgmma atom's operand tile (64 x atom_n for C, 64 x 16 for A,
    atom_n x 16 for B), or with ``tiled=True`` of the whole tiled MMA (all consumer warpgroups).

    For C this is the accumulator fragment: thread ``t`` (warp ``w = t // 32``, lane ``l``) holds rows
    ``16 w + l // 4`` and ``+8``, columns ``2 (l % 4) + {0, 1} + 8 j``.
    """
    op = operand.upper()
    if op not in ("A", "B", "C"):
        raise ValueError(f"operand must be 'A', 'B' or 'C', not {operand!r}")

    def work():
        tm = _tiles.make_tiled_mma(mma)
        if tiled:
            tv = {"A": tm.tv_layout_A_tiled, "B": tm.tv_layout_B_tiled, "C": tm.tv_layout_C_tiled}[op]
            tm_m, tm_n, tm_k = (int(tm.get_tile_size(i)) for i in range(3))
        else:
            tv = {"A": tm.tv_layout_A, "B": tm.tv_layout_B, "C": tm.tv_layout_C}[op]
            tm_m, tm_n, tm_k = mma.instruction_shape
        shape = {"A": (tm_m, tm_k), "B": (tm_n, tm_k), "C": (tm_m, tm_n)}[op]
        nt, nv = int(cute.size(tv, mode=[0])), int(cute.size(tv, mode=[1]))
        # A layout's value is the sum of its modes' values, so threads whose thread-mode offset is
        # equal own exactly the same elements: evaluate one representative per distinct offset.
        thr_mode = cute.get(tv, mode=[0])
        groups: dict[int, list[int]] = {}
        for t in range(nt):
            groups.setdefault(int(thr_mode(t)), []).append(t)
        M, N = shape
        thread = [[-1] * N for _ in range(M)]
        value = [[-1] * N for _ in range(M)]
        owners = [[0] * N for _ in range(M)]
        for members in groups.values():
            t0 = members[0]
            for v in range(nv):
                r, c = _py(cute.idx2crd(int(tv((t0, v))), shape))
                if owners[r][c]:
                    raise AssertionError(f"element ({r},{c}) of {op} reached twice")
                thread[r][c], value[r][c], owners[r][c] = t0, v, len(members)
        if any(o == 0 for row in owners for o in row):
            raise AssertionError(f"TV layout of {op} does not cover its {M}x{N} tile")
        return OwnershipTable(op, tiled, str(tv), shape, nt, nv, _tuples(thread), _tuples(value), _tuples(owners))

    return in_dsl(work)


# ---- 3. shared-memory banks ---------------------------------------------------------------------


@dataclass(frozen=True)
class BankTable:
    """Where one stage of a swizzled smem tile lands in the banks.

    ``offsets[r][c]``: physical element offset of logical ``(r, c)`` (mode 0, mode 1) from stage 0.
    ``chunk_groups[i][j]``: bank group (banks ``4g..4g+3``) of the ``j``-th 16-byte vector along the
    contiguous mode in strided line ``i`` (K-major bf16 A: row ``i``, ``k = 8j..8j+7``).  Conflict-free:
    any 8 consecutive lines put vector ``j`` in 8 different groups, so an 8 x 16-byte access touches
    all 32 banks once."""

    operand: str
    layout: str
    swizzle: str
    stage: int
    elem_bytes: int
    contiguous_mode: int  # 0 (M/N-major) or 1 (K-major, or N-major C)
    offsets: tuple[tuple[int, ...], ...]
    chunk_groups: tuple[tuple[int, ...], ...]

    @property
    def elems_per_chunk(self) -> int:
        return CHUNK_BYTES // self.elem_bytes

    def bank(self, r: int, c: int) -> int:
        """4-byte bank (0..31) of logical element ``(r, c)``."""
        return (self.offsets[r][c] * self.elem_bytes // BANK_BYTES) % NUM_BANKS

    def atom_rows(self, n: int = 8) -> list[list[int]]:
        """Bank group of each 16-byte chunk, for the first ``n`` lines (the rows of a swizzle atom)."""
        return [list(r) for r in self.chunk_groups[:n]]

    def conflict_free(self, lines: int = 8) -> bool:
        """Every aligned group of ``lines`` lines maps each chunk column to distinct bank groups."""
        cg = self.chunk_groups
        for i0 in range(0, len(cg) - lines + 1, lines):
            for j in range(len(cg[0])):
                if len({cg[i][j] for i in range(i0, i0 + lines)}) != lines:
                    return False
        return True

    def grid(self, level: str = "chunk") -> Grid:
        """``level='chunk'``: one cell per 16-byte vector (label = bank group); ``'element'``: one cell
        per element (label = physical offset), coloured by bank group."""
        names = {"A": ("m", "k"), "B": ("n", "k"), "C": ("m", "n")}[self.operand]
        notes = (f"layout {self.layout}", f"swizzle {self.swizzle} on byte addresses; stage {self.stage}; "
                 f"{self.elem_bytes} B/elem; bank group g = banks 4g..4g+3",
                 f"conflict-free per 8 lines: {self.conflict_free()}")
        if level == "element":
            keys = [[(o * self.elem_bytes // CHUNK_BYTES) % CHUNKS_PER_ROW for o in row] for row in self.offsets]
            return Grid(f"smem {self.operand} stage {self.stage}: physical offset (colour: 16B bank group)",
                        _tuples([[str(o) for o in row] for row in self.offsets]), _tuples(keys),
                        CHUNKS_PER_ROW, "bank group", names[0], names[1], notes)
        line = names[1 - self.contiguous_mode]
        vec = names[self.contiguous_mode]
        return Grid(f"smem {self.operand} stage {self.stage}: bank group of each 16B chunk",
                    _tuples([[str(g) for g in row] for row in self.chunk_groups]), self.chunk_groups,
                    CHUNKS_PER_ROW, "bank group", line, f"{vec} / {self.elems_per_chunk}", notes)


def smem_bank_pattern(tiles: _tiles.GemmTiles, operand: str = "A", stage: int = 0) -> BankTable:
    """Bank placement of one stage of the A, B or C (epilogue) shared-memory tile of ``tiles``."""
    op = {"A": "A", "B": "B", "C": "C", "EPI": "C"}.get(operand.upper())
    if op is None:
        raise ValueError(f"operand must be 'A', 'B' or 'C'/'epi', not {operand!r}")
    if op == "C":
        dtype_name, major_contig = tiles.c_dtype, (1 if tiles.c_major == "n" else 0)
        build, nstages = _tiles.make_smem_layout_epi, tiles.epi_stages
    else:
        dtype_name = tiles.mma.ab_dtype
        major = tiles.mma.a_major if op == "A" else tiles.mma.b_major
        major_contig = 1 if major == "k" else 0
        build = _tiles.make_smem_layout_a if op == "A" else _tiles.make_smem_layout_b
        nstages = tiles.ab_stages
    if not 0 <= stage < nstages:
        raise ValueError(f"stage {stage} out of range (0..{nstages - 1})")
    eb = _tiles.DTYPE_BYTES[dtype_name]

    def work():
        L = build(tiles)
        shape = _py(cute.shape(L))
        R, C = _size(shape[0]), _size(shape[1])
        flat = _physical(L, [(r, c, stage) for c in range(C) for r in range(R)], eb)
        offs = [[flat[r + R * c] for c in range(C)] for r in range(R)]
        return str(L), str(L.inner), offs

    text, swz, offs = in_dsl(work)
    R, C = len(offs), len(offs[0])
    vec = CHUNK_BYTES // eb
    lines, along = (C, R) if major_contig == 0 else (R, C)
    groups = []
    for i in range(lines):
        row = []
        for j in range(along // vec):
            cells = [(j * vec + e, i) if major_contig == 0 else (i, j * vec + e) for e in range(vec)]
            o = [offs[r][c] for r, c in cells]
            if o != list(range(o[0], o[0] + vec)) or (o[0] * eb) % CHUNK_BYTES:
                raise AssertionError(f"16-byte vector {j} of line {i} is not contiguous and aligned: {o}")
            row.append((o[0] * eb // CHUNK_BYTES) % CHUNKS_PER_ROW)
        groups.append(tuple(row))
    return BankTable(op, text, swz, stage, eb, major_contig, _tuples(offs), tuple(groups))


def epilogue_register_map(tiles: _tiles.GemmTiles, thread_step: int = 5) -> dict[str, int]:
    """Check the epilogue's register bookkeeping without a GPU: it copies accumulator ``e * n_rD + v``
    into register ``v`` of sub-tile ``e`` (M-block-major), right only if the MMA's C partition and the
    register->shared copy's *source* partition (``partition_S``, not the stmatrix addresses of
    ``partition_D``) name the same element.  ``{"bad": n, "checked": n}`` over every ``thread_step``-th
    consumer thread."""
    import cutlass
    import cutlass.utils.hopper_helpers as sm90_utils

    def run():
        tiled_mma = _tiles.make_tiled_mma(tiles.mma)
        m_t, n_t, _ = tiles.tile_mnk
        em, en = tiles.epi_tile_mn
        c_layout = _tiles.c_layout_enum(tiles)
        c_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(c_layout.is_m_major_c(), 4),
                                     cutlass.Float16)
        r2s_atom = sm90_utils.get_smem_store_op(c_layout, _tiles.dtype(tiles.c_dtype), cutlass.Float32)
        tiled_r2s = cute.make_tiled_copy_S(r2s_atom, cute.make_tiled_copy_C_atom(c_atom, tiled_mma))
        ident = cute.make_identity_tensor((m_t, n_t))
        epi_ident = cute.make_identity_tensor((em, en))
        n_epi_n = n_t // en
        bad = checked = 0
        for thr in range(0, 128 * tiles.mma.num_warpgroups, thread_step):
            tCcD = tiled_mma.get_slice(thr).partition_C(ident)
            tRS_c = tiled_r2s.get_slice(thr).partition_S(epi_ident)
            n_rD = cute.size(tRS_c)
            for e in range((m_t // em) * n_epi_n):
                for v in range(n_rD):
                    r, c = tCcD[e * n_rD + v]
                    r2, c2 = tRS_c[v]
                    checked += 1
                    bad += int(r != (e // n_epi_n) * em + r2 or c != (e % n_epi_n) * en + c2)
        return {"bad": bad, "checked": checked}

    return in_dsl(run)


__all__ = [
    "Grid",
    "LayoutTable",
    "OwnershipTable",
    "BankTable",
    "in_dsl",
    "evaluate",
    "mma_fragment_ownership",
    "smem_bank_pattern",
    "epilogue_register_map",
]
