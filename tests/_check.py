"""Elementwise result checks shared by the GEMM and attention tests.

Imported as ``from _check import ...`` (tests/ is on ``sys.path`` the way ``from conftest import`` relies
on: the test directories are not packages).

Why elementwise: a norm-wise relative error ``||out - ref|| / ||ref||`` averages a wrong row away (a
zeroed M-tail row of a 4097 x 136 output moves it by only sqrt(1/4097) = 0.0156, under the 2e-2 the GEMM
tests used).  Here every element must satisfy

    |out - ref| <= atol + rtol * mag

where ``mag`` is the magnitude of the terms the element is made of (|ref| for a plain product,
|alpha a b| + |beta c| with a C term), ``rtol`` covers one rounding to the output dtype, and ``atol``
is a small fraction of the problem's magnitude (fp32 accumulation order); NaN / Inf always fail.  The
tail regions (last row / column, the last partial 128- and 256-row and 64/128/256-column tiles) are
named in the failure message when they hold bad elements.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from cute_kernels.common import jit
from cute_kernels.testing import count_launches

#: relative tolerance per output dtype: twice the unit roundoff of one rounding to that dtype (bf16 keeps 8
#: significant bits: u = 2^-8; fp16 11 bits: u = 2^-11); fp32 outputs are held to the absolute term.
RTOL = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float32: 2.0 ** -20, torch.float64: 2.0 ** -40}


def misaligned(shape, dtype=torch.bfloat16, device="cpu") -> torch.Tensor:
    """A contiguous (uninitialized) tensor whose data pointer is 2 bytes past a 16-byte boundary."""
    n = math.prod(shape)
    return torch.empty(n + 16, dtype=dtype, device=device)[1:1 + n].view(shape)

#: absolute tolerance as a fraction of the problem's typical output magnitude
#: ``sqrt(K) * rms(a) * rms(b)`` (+ |beta| rms(c)): room for the fp32 accumulation order of the tensor
#: cores and the split-K reductions (estimated <= 2e-4 of it at K = 32768), ~10x below the smallest error
#: a lost K term, a zeroed element or a stale tile would make.
GEMM_ATOL_FRAC = 2e-3


def _rms(t: torch.Tensor) -> float:
    return t.double().pow(2).mean().sqrt().item() if t.numel() else 0.0


def tail_regions(shape, m_tiles=(128, 256), n_tiles=(64, 128, 256)) -> list[tuple[str, tuple]]:
    """(name, index) of the tails of an (..., M, N) output: the last row and column, and the rows / columns
    of each partial last tile (where M or N is not a multiple of that tile size)."""
    if len(shape) < 2 or shape[-2] == 0 or shape[-1] == 0:
        return []
    m, n = shape[-2], shape[-1]
    regions = [(f"last row (M-1 = {m - 1})", (..., slice(m - 1, m), slice(None))),
               (f"last column (N-1 = {n - 1})", (..., slice(None), slice(n - 1, n)))]
    for t in m_tiles:
        if m % t and m > t:
            regions.append((f"M-tail rows {m - m % t}..{m - 1} (partial {t}-row tile)", (..., slice(m - m % t, m), slice(None))))
    for t in n_tiles:
        if n % t and n > t:
            regions.append((f"N-tail columns {n - n % t}..{n - 1} (partial {t}-column tile)",
                            (..., slice(None), slice(n - n % t, n))))
    return regions


def elementwise_violations(out: torch.Tensor, ref: torch.Tensor, atol, rtol: float, mag=None) -> torch.Tensor:
    """Boolean mask of the elements with ``not |out - ref| <= atol + rtol * mag`` (NaN / Inf: True).
    ``atol`` a number or a tensor broadcasting to ``ref``; ``mag`` defaults to ``|ref|``."""
    o, r = out.double(), ref.double()
    mag = r.abs() if mag is None else mag.double()
    atol = atol.double() if isinstance(atol, torch.Tensor) else atol
    tol = atol + rtol * mag
    ok = (o - r).abs() <= tol  # False for NaN / Inf in out
    return ~(ok & torch.isfinite(o))


def _describe(bad, out, ref, atol, rtol, mag, what):
    idx = bad.nonzero()
    o, r = out.double(), ref.double()
    err = (o - r).abs()
    err = torch.where(torch.isfinite(err), err, torch.full_like(err, math.inf))
    mag = r.abs() if mag is None else mag.double()
    tol = (atol.double() if isinstance(atol, torch.Tensor) else torch.tensor(atol, dtype=torch.float64, device=r.device)
           ) + rtol * mag
    tol = tol.expand_as(r)
    worst = tuple(int(i) for i in idx[((err - tol)[bad]).argmax()].tolist())
    first = [tuple(int(i) for i in row) for row in idx[:5].tolist()]
    return (f"{what}: {idx.shape[0]} of {bad.numel()} elements outside |out - ref| <= atol + rtol*mag "
            f"(rtol {rtol:.3g}); worst at {worst}: out {o[worst].item():.6g}, ref {r[worst].item():.6g}, "
            f"tol {tol[worst].item():.3g}; first bad {first}")


def assert_close_elementwise(out: torch.Tensor, ref: torch.Tensor, *, atol, rtol: float, mag=None, what: str = "",
                             regions=None) -> None:
    """Raise AssertionError unless every element of ``out`` is within ``atol + rtol * mag`` of ``ref``;
    the named ``regions`` (default: :func:`tail_regions`) that hold bad elements are named first (most
    bad elements first), so a bad tail is reported as such."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    regions = tail_regions(ref.shape) if regions is None else regions
    full = elementwise_violations(out, ref, atol, rtol, mag)
    if not full.any():
        return
    failing = [(name, int(full[index].sum())) for name, index in regions if full[index].any()]
    if failing:  # the tail region with the most bad elements first: a zeroed column names the column
        failing.sort(key=lambda x: -x[1])
        where = "; ".join(f"{name}: {cnt} bad" for name, cnt in failing)
        raise AssertionError(f"{what} tails wrong ({where})\n" + _describe(full, out, ref, atol, rtol, mag, what or "output"))
    raise AssertionError(_describe(full, out, ref, atol, rtol, mag, what or "output"))


def gemm_reference(a, b, alpha=1.0, beta=0.0, c=None):
    """(alpha * a @ b + beta * c, |alpha * a @ b| + |beta * c|) in float64."""
    ab = alpha * (a.double() @ b.double())
    if c is None or beta == 0:
        return ab, ab.abs()
    bc = beta * c.double()
    return ab + bc, ab.abs() + bc.abs()


def gemm_tolerance(a, b, out_dtype, alpha=1.0, beta=0.0, c=None) -> tuple[float, float]:
    """(atol, rtol) of :func:`check_gemm` for these operands and output dtype."""
    k = a.shape[-1]
    scale = abs(alpha) * math.sqrt(max(k, 1)) * _rms(a) * _rms(b)
    if c is not None and beta != 0:
        scale += abs(beta) * _rms(c)
    return GEMM_ATOL_FRAC * scale, RTOL[out_dtype]


def check_gemm(out, a, b, alpha=1.0, beta=0.0, c=None, *, ref=None, what: str = "gemm") -> None:
    """``out`` == alpha * a @ b + beta * c elementwise (float64 reference; tails checked by name).
    ``ref``: a precomputed ``gemm_reference(a, b, alpha, beta, c)`` (reused across calls)."""
    ref, mag = gemm_reference(a, b, alpha, beta, c) if ref is None else ref
    atol, rtol = gemm_tolerance(a, b, out.dtype, alpha, beta, c)
    assert_close_elementwise(out, ref, atol=atol, rtol=rtol, mag=mag, what=f"{what} {tuple(out.shape)} {out.dtype}")


# ---------------------------------------------------------------- GEMM tile-variant GPU checks
# The bodies the forced-tile tests (test_gemm_tiles256.py) run, each with an elementwise check; outputs
# passed as ``out=`` are NaN-poisoned first.
def check_shapes_majors(run, mnk, majors, tile_n):
    import pytest

    from conftest import gemm_operand, nan_out, tma_able

    m, n, k = mnk
    a = gemm_operand((m, k), majors[0], torch.bfloat16)
    b = gemm_operand((k, n), majors[1], torch.bfloat16)
    if not tma_able(a, b):
        pytest.skip("operands TMA cannot describe take the cp.async mainloop (cooperative 128-row tiles)")
    out = nan_out(m, n)
    run(a, b, out=out, tile_n=tile_n)
    check_gemm(out, a, b)


def check_random(run, mnk, **kw):
    """Row-major bf16 operands of (m, n, k), NaN-poisoned bf16 out, one forced-tiles call."""
    from conftest import nan_out

    m, n, k = mnk
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = nan_out(m, n)
    run(a, b, out=out, **kw)
    check_gemm(out, a, b)


def check_alpha_beta(run, c_kind, out_dtype, tile_n):
    from conftest import make_c, nan_out

    m, n, k = 2333, 2088, 136  # ragged in M and N, a few tiles per CTA
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = make_c(c_kind, m, n)
    out = nan_out(m, n, dtype=out_dtype)
    run(a, b, out=out, alpha=0.5, beta=-1.25, c=c, tile_n=tile_n)
    check_gemm(out, a, b, 0.5, -1.25, c)


def check_dtypes(run, in_dtype, out_dtype, **kw):
    """The ``out_dtype`` path (a fresh output), and the same through a NaN-poisoned ``out``."""
    from conftest import nan_out

    a = torch.randn(509, 384, device="cuda", dtype=in_dtype)
    b = torch.randn(384, 520, device="cuda", dtype=in_dtype)
    out = run(a, b, out_dtype=out_dtype, **kw)
    assert out.dtype == out_dtype
    check_gemm(out, a, b)
    poisoned = nan_out(509, 520, dtype=out_dtype)
    run(a, b, out=poisoned, **kw)
    check_gemm(poisoned, a, b, what="gemm into a poisoned out")


def check_batched(run, majors, tile_n):
    from conftest import gemm_operand, nan_out

    L, m, n, k = 3, 1296, 1064, 200
    a = gemm_operand((m, k), majors[0], torch.bfloat16, batch=L)
    b = gemm_operand((k, n), majors[1], torch.bfloat16, batch=L)
    out = nan_out(L, m, n, dtype=torch.float32)
    run(a, b, out=out, tile_n=tile_n)
    check_gemm(out, a, b)


def check_unaligned_out(run, **kw):
    from conftest import nan_out

    m, n, k = 1000, 2000, 264
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    big = nan_out(m, n + 1)
    out = big[:, :n]  # rows not 16-byte aligned: predicated direct stores
    run(a, b, out=out, **kw)
    check_gemm(out, a, b)
    assert torch.isnan(big[:, n]).all(), "wrote past the view"


def assert_raises_before_any_launch(exc, match: str, fn, *args, **kwargs) -> None:
    """``fn(*args, **kwargs)`` raises ``exc`` with a message matching ``match``, and nothing was
    planned, compiled or launched on the way."""
    stats = dict(jit.stats)
    with count_launches() as n, jit.dry_run() as dry:
        with pytest.raises(exc, match=match):
            fn(*args, **kwargs)
    assert n.total() == 0 and dry.seen == [] and jit.stats == stats


def refused(launchers: dict, key: tuple, call, exc, match: str) -> None:
    """A host fast-path case: ``key`` has a launcher in ``launchers`` (so ``call`` really hits it), and
    ``call`` raises ``exc`` matching ``match`` -- the checked path's error -- launching nothing."""
    assert key in launchers, "the case must take the fast path (its key must have a launcher)"
    with count_launches() as n, pytest.raises(exc, match=match):
        call()
    assert n.total() == 0, n


@contextlib.contextmanager
def no_compiles():
    """Asserts that nothing compiled inside the block."""
    before = jit.stats["compiles"]
    yield
    assert jit.stats["compiles"] == before, "a fast-path call compiled"


# ---- attention masks: the rule the window walks of the forward and the backward are checked against
def visible_window(q, k, Sq, Sk, left, right):
    """Query q (position p = q + Sk - Sq) sees key k iff k < Sk and p - left <= k <= p + right (-1: unbounded)."""
    p = q + Sk - Sq
    return 0 <= k < Sk and (left < 0 or k >= p - left) and (right < 0 or k <= p + right)


WINDOWS = [(-1, -1), (-1, 0), (0, 0), (3, 0), (0, 5), (7, 9), (16, -1), (-1, 16), (40, 40), (100, 0), (0, 100)]
