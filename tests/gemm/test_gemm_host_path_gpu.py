"""gemm's host fast path on the GPU, against the real compiled functions (issue 19: host time per call).

The launcher key (``cute_kernels.gemm.host._key``) leaves out what the compiled function's TVM-FFI
entry checks itself before launching (``cute_kernels.common.jit.direct``): b's dtype, every device,
and out's and c's shapes (sizes shared with a and b).  For each plan kind, calls whose key *is* a
launcher's (asserted) but that differ in one such fact must raise the checked path's own error, naming
the argument, with nothing launched; afterwards the launchers still serve the first calls, correctly
and without a compile.  The same rules on the CPU with a stub: tests/common/test_host_path.py; the
attention ops': tests/attention/test_host_path_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

import cute_kernels
from cute_kernels.gemm import host as GH
from cute_kernels.gemm import plan as GP
from cute_kernels.testing import count_launches
from _check import check_gemm, no_compiles, refused

pytestmark = pytest.mark.gpu
BF = torch.bfloat16

#: (M, N, K, batch) -> the plan kind it gets (asserted: each kind's launcher is exercised)
SHAPES = {
    (256, 256, 128, None): "persistent",
    (96, 160, 72, 3): "persistent",  # batched
    (48, 256, 192, None): "swapped",  # skinny: the swapped entry takes torch's operand order
    (16, 4096, 4096, None): "swapped",  # skinny, last-CTA fixup (a workspace)
    (128, 128, 8192, None): "splitk-cluster",
}


def operands(m, n, k, batch, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    lead = () if batch is None else (batch,)
    a = torch.randn(*lead, m, k, generator=g, device="cuda").to(BF)
    b = torch.randn(*lead, k, n, generator=g, device="cuda").to(BF)
    c = torch.randn(*lead, m, n, generator=g, device="cuda").to(BF)
    return a, b, c


def rows_less(t: torch.Tensor) -> torch.Tensor:
    """``t`` less its last row: another shape, the same strides (so the same key)."""
    return t[..., :-1, :]


@pytest.mark.parametrize("mnkl", list(SHAPES), ids=lambda s: "x".join(map(str, s)))
def test_gemm_refusals(mnkl):
    m, n, k, batch = mnkl
    a, b, c = operands(m, n, k, batch, seed=sum(mnkl[:3]))
    out = torch.empty_like(c)

    def calls():
        return cute_kernels.gemm(a, b, out=out), cute_kernels.gemm(a, b), cute_kernels.gemm(a, b, c=c, beta=0.5)

    calls()  # plans, compiles, makes the launchers
    with count_launches() as want:
        calls()
    assert GP.plan(a, b, out).kind == SHAPES[mnkl]

    def key(a=a, b=b, out=out, c=None, beta=0.0):
        return GH._key(a, b, out, c, beta, None)

    L = GH._launchers
    cases = [  # (overrides, exception, message)
        (dict(b=b.half()), TypeError, "a and b must have the same dtype"),
        (dict(b=b.cpu()), ValueError, "b is on cpu"),
        (dict(out=out.cpu()), ValueError, "out is on cpu"),
        (dict(out=rows_less(out)), ValueError, "out has shape"),
    ]
    with no_compiles():
        for over, exc, match in cases:
            args = {"a": a, "b": b, "out": out, **over}
            refused(L, key(**args), lambda x=args: cute_kernels.gemm(x["a"], x["b"], out=x["out"]), exc, match)
        refused(L, key(b=b.half(), out=None), lambda: cute_kernels.gemm(a, b.half()), TypeError, "same dtype")
        for bad_c, match in ((rows_less(c), "c has shape"), (c.cpu(), "c is on cpu")):
            refused(L, key(out=None, c=bad_c, beta=0.5), lambda x=bad_c: cute_kernels.gemm(a, b, c=x, beta=0.5),
                    ValueError, match)
        out.fill_(float("nan"))
        with count_launches() as cnt:
            res_out, res, res_c = calls()
    assert cnt.as_dict() == want.as_dict() and cnt["gemm"] >= 3 and res_out is out
    check_gemm(out, a, b, what="out= after refusals")
    check_gemm(res, a, b, what="allocated after refusals")
    check_gemm(res_c, a, b, beta=0.5, c=c, what="with c after refusals")
