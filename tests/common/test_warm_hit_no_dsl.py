"""A warm process never imports the DSL compiler: every op's host path (validation, planning, keys,
launchers) lives in modules without ``cutlass``, kernel modules are imported by builders only
(:func:`cute_kernels.common.jit.lazy_builder`), and a disk-cache hit loads the linked ``.so`` through
TVM-FFI.  So a process that finds its kernels in the cache gets them in milliseconds and ~100 MiB
lighter (``profiles/NOTES-host.md``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

#: each op's kernel getter on one small configuration (the fetch the op's call makes), as a script
_FETCH = """
import os, sys
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
import torch
from cute_kernels.attention import backward as BW, decode as D, decode_plan as DP, forward as FW, merge as MG
from cute_kernels.gemm import plan as GP

fns = [
    D.get_decode_kernel(DP.make_config(torch.bfloat16, 128, 4, False, 0, True, True)),
    MG.get_merge_kernel(MG.MergeConfig("float32", "bfloat16", 128)),
    FW.get_forward_kernel(FW.plan(torch.bfloat16, 64, True, False, False, 0, False, False)),
    BW._get_any(BW.bwd_plan(torch.bfloat16, 64, True)[2]),
]
a = torch.empty(256, 256, dtype=torch.bfloat16)
fns.append(GP.make_plan(a, a, allow_cpu=True).fn)  # (planned on CPU tensors, as warmup_gemm does)
from cute_kernels.common import jit
print("cutlass" in sys.modules, all(f is not None for f in fns), jit.stats["compiles"], jit.stats["disk_hits"])
"""


def test_op_modules_import_no_dsl():
    """Each op's host modules (and the Transformers integration) import without the DSL."""
    code = ("import sys\nimport cute_kernels.attention.decode, cute_kernels.attention.forward, "
            "cute_kernels.attention.backward, cute_kernels.attention.merge, cute_kernels.gemm.host, "
            "cute_kernels.integrations.hf, cute_kernels.integrations.sdpa\nimport cute_kernels\n"
            "cute_kernels.flash_attn, cute_kernels.decode_attn, cute_kernels.gemm, cute_kernels.merge_states\n"
            "print('cutlass' in sys.modules, any(m.startswith('cutlass') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout


def test_warm_fetch_of_every_op_imports_no_dsl(tmp_path):
    """A first process compiles one configuration of each op into a fresh cache (and imports the DSL to
    do so); a second finds all five on disk and never imports it."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc): cache entries are .o files only, which load through the DSL")
    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=str(tmp_path / "cache"), CUTE_KERNELS_DISK_CACHE="1",
               CUTE_KERNELS_LOG_LEVEL="WARNING")
    cold = subprocess.run([sys.executable, "-c", _FETCH], env=env, capture_output=True, text=True, timeout=900)
    assert cold.returncode == 0, cold.stderr[-3000:]
    assert cold.stdout.split()[:2] == ["True", "True"], cold.stdout
    warm = subprocess.run([sys.executable, "-c", _FETCH], env=env, capture_output=True, text=True, timeout=300)
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert warm.stdout.split() == ["False", "True", "0", "5"], warm.stdout


#: real calls of each op on the GPU, checked against torch; prints whether the DSL got imported
_CALLS = """
import sys
import torch
import torch.nn.functional as F
import cute_kernels as ck

torch.manual_seed(0)
bf = torch.bfloat16
a, b = torch.randn(256, 192, dtype=bf, device="cuda"), torch.randn(192, 320, dtype=bf, device="cuda")
errs = [(ck.gemm(a, b).float() - a.float() @ b.float()).abs().max().item() / 192 ** 0.5]
q, k, v = (torch.randn(2, 333, 4, 64, dtype=bf, device="cuda") for _ in range(3))
ref = F.scaled_dot_product_attention(*(x.transpose(1, 2).float() for x in (q, k, v)), is_causal=True).transpose(1, 2)
errs.append((ck.flash_attn(q, k, v, causal=True).float() - ref).abs().max().item())
qd = torch.randn(2, 1, 8, 128, dtype=bf, device="cuda")
kc, vc = (torch.randn(2, 1000, 2, 128, dtype=bf, device="cuda") for _ in range(2))
lens = torch.tensor([1000, 517], dtype=torch.int32, device="cuda")
o = ck.decode_attn(qd, kc, vc, cache_seqlens=lens, num_splits=4)
for i, n in enumerate((1000, 517)):
    r = F.scaled_dot_product_attention(qd[i:i + 1].transpose(1, 2).float(), kc[i:i + 1, :n].transpose(1, 2).float(),
                                       vc[i:i + 1, :n].transpose(1, 2).float(), enable_gqa=True).transpose(1, 2)
    errs.append((o[i:i + 1].float() - r).abs().max().item())
torch.cuda.synchronize()
print("cutlass" in sys.modules, max(errs) < 0.05, " ".join(f"{e:.4f}" for e in errs))
"""


@pytest.mark.gpu
def test_warm_process_launches_without_the_dsl(tmp_path):
    """On the GPU: a process whose kernels are all in the cache runs gemm, flash_attn and decode_attn
    (split, so its merge too) with the right values and never imports the DSL."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc): cache entries are .o files only, which load through the DSL")
    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=str(tmp_path / "cache"), CUTE_KERNELS_DISK_CACHE="1",
               CUTE_KERNELS_LOG_LEVEL="WARNING")
    for run, dsl in (("cold", "True"), ("warm", "False")):
        out = subprocess.run([sys.executable, "-c", _CALLS], env=env, capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, f"{run}: {out.stderr[-3000:]}"
        assert out.stdout.split()[:2] == [dsl, "True"], f"{run}: {out.stdout}"
