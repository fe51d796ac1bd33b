"""``cute-kernels bench``: the benchmarks of the kernels against their peers, on the GPU.

    cute-kernels bench gemm|attention|decode|model|gaps|train|all [--quick] [--shapes ...] [--out DIR] [...]

Each kind is a module with ``main(argv) -> int`` and a ``run(...)`` returning a results document
(:mod:`.results`): :mod:`.gemm`, :mod:`.attention` (``--backward``: :mod:`.attention_backward`, results
of kind ``attention-backward``), :mod:`.decode`; ``model`` is the end-to-end decode benchmark of
:mod:`cute_kernels.tools.bench_model` (when present); ``gaps`` (:mod:`.gaps`) re-times issue 36's nine
rows of the others under the paired timer, against their targets, and ``train`` (:mod:`.train`) times
a training step of a Llama-3-8B-shaped model on the kernels against PyTorch's SDPA backends; both run
only by name.  ``all``
runs each of :data:`KINDS` in turn with the options they share (``--quick``, ``--out``,
``--repeats``).  Every peer of a shape is timed by the same timer in interleaved rounds
(:mod:`.timing`), beside a same-run ceiling (:mod:`.ceiling`); results go to ``--out`` (default ``profiles/results``) as JSON + markdown naming
device, date, versions and commit.  ``cute-kernels charts`` draws them (no GPU needed).
"""

from __future__ import annotations

import importlib
import sys

KINDS = ("gemm", "attention", "decode", "model")
#: kinds run only by name, not by ``all`` (gaps re-times rows of the kinds above; train needs
#: transformers and about 85 GB of device memory)
ALONE = ("gaps", "train")
PROG = "cute-kernels bench"
USAGE = f"""usage: {PROG} {{{','.join(KINDS + ALONE)},all}} [options]

  gemm        cute-kernels gemm vs cuBLAS / quack
  attention   flash_attn vs cuDNN SDPA / FA2 SDPA / FA4, with its MMA bound; --backward: its
              gradients (autograd.grad of one forward) vs the same peers, with the backward's MMA bound
  decode      decode_attn vs cuDNN SDPA / FA2 SDPA / FA4, with a bare read of the KV bytes
  model       end-to-end decode of a model (cute_kernels.tools.bench_model)
  gaps        issue 36's nine rows (decode, GEMM, forward), each ours against the figure its target
              names under the paired timer, met or not; not part of all
  train       a training step (forward + loss + backward + AdamW) of a Llama-3-8B-shaped model:
              attn_implementation="cute_kernels" with and without patch_linear vs HF sdpa on each of
              torch's SDPA backends, paired timer, attention / GEMM / rest split; not part of all
  all         gemm, attention, decode (and model when present), with the shared options
              --quick, --out DIR, --repeats N

Options of one kind: {PROG} KIND --help.  Common ones: --quick (two small shapes, one round: about
a minute), --shapes LIST, --out DIR (default profiles/results), --repeats N.
"""
ALL_USAGE = f"""usage: {PROG} all [--quick] [--out DIR] [--repeats N]

Runs {', '.join(KINDS)} in turn (a kind not in this version is skipped with a note), each with these
options only (model takes --repeats as its --rounds); the exit status is the worst kind's.

  --quick       two small shapes per kind, one round (about a minute each)
  --out DIR     folder for the JSON + markdown results (default profiles/results)
  --repeats N   interleaved timing rounds
"""


def _module(kind: str):
    """The kind's module (``model``: cute_kernels.tools.bench_model), or None when it is not there."""
    name = "cute_kernels.tools.bench_model" if kind == "model" else f"{__name__}.{kind}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name == name:
            return None
        raise


def _shared(argv: list[str]) -> list[str]:
    """The options of ``all`` that every kind takes: --quick, --out DIR, --repeats N."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--quick":
            out.append(a)
        elif a in ("--out", "--repeats") and i + 1 < len(argv):
            out += [a, argv[i + 1]]
            i += 1
        elif a.startswith(("--out=", "--repeats=")):
            out.append(a)
        else:
            raise ValueError(f"bench all: option {a!r} is not shared by every kind (only --quick, --out, --repeats)")
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    """``cute-kernels bench KIND [options]``; returns the exit status (the worst of ``all``'s kinds)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)  # no kind: a usage error
        return 0 if argv else 2
    kind, rest = argv[0], argv[1:]
    if kind not in (*KINDS, *ALONE, "all"):
        print(f"{PROG}: error: unknown kind {kind!r}; one of {', '.join(KINDS + ALONE)}, all (see {PROG} --help)",
              file=sys.stderr)
        return 2
    if kind != "all":
        mod = _module(kind)
        if mod is None:
            print(f"{PROG} {kind}: skipped, cute_kernels.tools.bench_model is not in this version")
            return 0
        return mod.main(rest) if kind == "model" else mod.main(rest, prog=f"{PROG} {kind}")
    if any(a in ("-h", "--help") for a in rest):
        print(ALL_USAGE)
        return 0
    try:
        shared = _shared(rest)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    status = 0
    for k in KINDS:
        mod = _module(k)
        if mod is None:
            print(f"{PROG} {k}: skipped, cute_kernels.tools.bench_model is not in this version")
            continue
        print(f"=== {PROG} {k} {' '.join(shared)}", flush=True)
        try:
            if k == "model":  # its rounds option is --rounds
                rc = mod.main([{"--repeats": "--rounds"}.get(a, a.replace("--repeats=", "--rounds=")) for a in shared])
            else:
                rc = mod.main(list(shared), prog=f"{PROG} {k}")
        except SystemExit as e:  # a kind's argument error: report and go on with the next kind
            rc = e.code if isinstance(e.code, int) else 2
        except Exception as e:  # noqa: BLE001 - one kind failing must not lose the others' results
            print(f"{PROG} {k}: failed: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr, flush=True)
            rc = 1
        status = max(status, rc or 0)
    return status
