#!/bin/bash
# One device call: GPU tests, then benchmarks.  Logs and results land in $OUT (keep it to a few files).
#   source .device/setup.sh && bash profiles/gpu_session.sh STEP...
# Steps (each under its own `timeout`; seconds overridable where a variable is named):
#   all-tests     every GPU test, GPU_TESTS_N workers (pytest-xdist, default 8; the suite is compile-bound:
#                 14 of the 16 cores): > 450 s cold compile cache at 8 (2026-12-04)                  [TESTS_S]
#   gemm-tests    tests/gemm, 8 workers                                                             [GEMM_TESTS_S]
#   attn-tests    tests/attention, 8 workers                                                        [ATTN_TESTS_S]
#   paged-tests   tests/attention/test_forward_paged.py, 8 workers                                   [PAGED_TESTS_S]
#   attn-k        tests/attention -k "$PYTEST_K", 8 workers                                          [PYTEST_S]
#   gemm-k        tests/gemm -k "$PYTEST_K", 8 workers                                              [PYTEST_S]
#   decode-tests  the decode GPU tests (plain, arguments, windows / cache_leftpad), 8 workers         [DECODE_TESTS_S]
#   backward-tests  the backward, packed backward and autograd GPU tests, 8 workers                 [BWD_TESTS_S]
#   variant-tests the forward variants' GPU tests (softcap / sinks / windows), 8 workers             [VARIANT_TESTS_S]
#   hf-tests      tests/integrations (Transformers, sdpa, torch.compile ops), 8 workers             [HF_TESTS_S]
#   stress        profiles/stress.py: a warm-up run (kernels compiled in parallel), then the same cases under
#                 compute-sanitizer memcheck, racecheck, synccheck (each < 100 s warm); all in stress.log
#                 [STRESS_ARGS: e.g. "--ops gemm" to split the tools' runs over calls; STRESS_TOOLS; STRESS_S per tool]
#   sanitize      the same as stress (its old name)
#   sweep         profiles/sweep.py: >= 120 random shapes per op against a float32/64 reference, the JSON
#                 into $OUT (~3-5 min cold compile cache, ~1 min warm)                     [SWEEP_S, SWEEP_ARGS]
#   sweep-quick   profiles/sweep.py --quick (24 shapes per op)
#   bench-gemm    profiles/bench_gemm.py (the GEMM issue's nine shapes vs cuBLAS / quack)         [BENCH_S, BENCH_ARGS]
#   bench-gemm-tune     the same after autotuning ours
#   bench-gemm-decode   bench_gemm.py --preset decode (M <= 64, decode-time shapes)
#   gemm-raster-cand    bench_gemm.py --configs: the l2_model.py raster candidates for 4096^3 / 4096x14336
#   gemm-stage-cand  bench_gemm.py --configs default:stage: misaligned operands copied into aligned buffers + the TMA
#                 plan, beside the default cp.async mainloop and cuBLAS (issue 36's 4097x127x1000 and two others)
#   ab-gemm / ab-gemm2  profiles/ab_gemm.py, paired call-by-call A/B of GEMM variants               [AB_ARGS / AB2_ARGS]
#   ab-gemm-224   the 128 x 224 tile (test_gemm_tile_224 first, then ab_gemm.py) against the default and cuBLAS on
#                 issue 36's 3 x 1000^3 and on shapes whose N quantizes better in 224 (3584, 1792, 5000,
#                 7168): whether default_tiles should take it (not a candidate before this is measured)   [AB224_S]
#   ab-gemm-parts  split-K's shared finish (GemmConfig.fixup_parts: every contributor stores a part of its tile)
#                 -- test_splitk_fixup_numerics[parts] first (a hang shows as this step's timeout), then
#                 ab_gemm.py default vs default:parts vs cuBLAS on the persistent split-K shapes (issue 36's
#                 1024x1024x32768; 512x512x65536 and the others at 0.83-0.96x), and 128 x 256 tiles split 2 ways
#                 with it (issue 36's 512x4096x14336, unsplit 128 x 128 by default: 0.987x)   [ABPARTS_S]
#   ab-commits    profiles/ab_commits.py: two source trees (BEFORE, default .ab_before) in one call, AB_WHAT of
#                 gemm,gemm_decode,decode,attention,attention_bwd (default the first three), AB_ROUNDS;
#                 BEFORE_PATCH=FILE instead: the before tree is this one with FILE reverse-applied (`git diff
#                 OLD -- cute_kernels layouts > FILE`: a few KB to carry, not a second tree)   [AB_COMMITS_S]
#   bench-decode  profiles/bench_decode.py (decode vs cuDNN / FA2 / FA4)
#   ab-backward-det  the deterministic GPU tests (one and two dQ warps) first, then profiles/ab_backward.py
#                 --variants det,det2w,det2wg: deterministic=True (and with BwdTile.dq_warps = 2, dq_groups = 2) against the default
#                 backward call on the backward bench's shapes (issue 33: within 15%), paired    [AB_BWD_S]
#   ab-backward-carry  the dk_carry / dv_early / qdo_rings / lpt / kv_reduce GPU tests, then profiles/ab_backward.py
#                 --variants bound,dvearly,tm64early,lpt,kvreduce,qdoearly,carryearly,qdo,carry (bound: the MMA bound
#                 beside them; kvreduce: GQA's dK / dV by TMA reduce-adds, the GQA shape): FlashBwdConfig.lpt (causal CTAs longest
#                 first in L2-sized head sections), BwdTile.dv_early (dV issued before the dP^T wait), qdo_rings
#                 (Q and dO in rings of their own), dk_carry (dK running on into the next query tile) and pairs,
#                 against the planned tile on the backward bench's shapes, paired, gradients compared (issue 33)
#                 [AB_BWD_S]
#   ab-attention-softcap  profiles/ab_attention.py --softcap 30: the softcap forward against a share of its exp2s by
#                 polynomial on the FMA pipes (poly1 / 2 / 4) and the plain kernel, peers beside, and the bounds
#                 (mma_only, softmax_only: plain / max of them = the most overlap allows; issue 34's
#                 softcap-within-5% row; ~3-4 min cold)                                          [AB_ATTN_S]
#   ab-attention-prefetch  FwdTile.prefetch_tile's GPU test, then ab_attention.py on the short causal shapes (issue
#                 36's b32 s512 row) and two long ones: the next dynamic tile claimed before the current one's loads
#                 (prefetch; dynamic_prefetch for the full shape), beside the default, the hardware schedule and
#                 the MMA bound                                                                    [AB_PREFETCH_S]
#   ab-attention-psmem  the P-through-shared-memory forward (FwdTile.p_smem: test_gpu_p_smem_matches_reference first),
#                 then ab_attention.py on the D 96 shapes (issue 36's b3 hq24 hkv8 s5000 and the bench's causal
#                 one): 192 x 128 / 192 x 144 tiles with P in shared memory against the default and FA4   [AB_PSMEM_S]
#   bench-variants  profiles/bench_variants.py (issue 34: softcap / sink / window vs the plain calls, paired) [VARIANTS_S]
#   bench-gaps    profiles/bench_gaps.py (issue 36's nine rows vs their targets, paired timer; ~2 min warm) [GAPS_S]
#   bench-attention  profiles/bench_attention.py (the forward vs cuDNN / FA2 SDPA / FA4, + its MMA bound) [BENCH_S]
#   bench-attention-varlen  profiles/bench_attention.py --varlen (issue 18: packed / windowed / paged vs FA4,
#                 our dense kernel at the same work; ~2-3 min cold)       [BENCH_VARLEN_S, BENCH_VARLEN_ARGS]
#   bench-attention-backward  profiles/bench_attention.py --backward (issue 32: dq/dk/dv vs cuDNN / FA2 SDPA / FA4,
#                 + the backward's MMA bound, gradients checked against cuDNN's)                 [BENCH_BWD_S]
#   bench-attention-backward-varlen  profiles/bench_attention.py --backward --varlen (issue 33: the packed backward
#                 vs FA4's varlen backward on the --varlen bench's two packed cases, paired; gradients vs FA4's
#                 and a float32 reference; ~3-5 min cold)          [BENCH_BWD_VARLEN_S, BENCH_BWD_VARLEN_ARGS]
#   backward-d256  the backward GPU tests' D 256 cases (-k 256), then bench_attention.py --backward --only d256
#                 (b4 h16 s4096 d256 vs cuDNN / FA2 SDPA / FA4 and its MMA bound; ~3 min cold)   [BWD_D256_S]
#   host-tests    the host paths on the GPU: tests/attention/test_host_path_gpu.py and the decode tests
#                 (the fast paths' keys, guards and launchers with real launches)                [HOST_TESTS_S]
#   bench-quick   cute-kernels bench all --quick (gemm, attention, decode, model; ~1 min each)       [QUICK_S]
#   bench-test    tests/tools/test_bench.py on the GPU (each kind's --quick run, the gemm one < 60 s; train's
#                 --quick too, ~50 GB of device memory)                                           [BENCH_TEST_S]
#   read-ceiling  profiles/read_ceiling.py (the fastest bare read of each bandwidth target's bytes)   [CEIL_S]
#   host          profiles/bench_host.py (first-call time, host time per call)
#   host-ab       profiles/bench_host.py --no-first-call on the BEFORE tree (default .ab_before: a `git archive`
#                 of cute_kernels layouts profiles) and on this one, alternated, HOST_AB_RUNS rounds (default 2), both
#                 pinned to core HOST_AB_CPU (default 3)
#   host-ab2      profiles/host_ab.py: the same rows on the BEFORE tree and this one, workers pinned to core HOST_AB_CPU,
#                 HOST_AB2_ROUNDS (default 60) short interleaved rounds, paired per round (issue 31's bar)   [HOST_AB2_S]
#   import-time   whole-process `import torch` / `import cute_kernels` (this tree, then BEFORE if present),
#                 alternated, IMPORT_RUNS times each (default 5); wall seconds per run; then the package's own
#                 share by `python3 -X importtime` (cute_kernels minus the torch inside it), 3 runs
#   bench-model   profiles/bench_model.py (end-to-end decode of a Llama-3-8B-shaped model)              [MODEL_S]
#   bench-generate  profiles/bench_generate.py: eager generate() tokens/s, ours vs HF sdpa / sdpa_gqa, 9 rounds, b1 and
#                 b8, pinned to core HOST_AB_CPU (default 3) as host-ab is (issue 34; ~2 min warm)  [GEN_S, GEN_ARGS]
#   bench-model-mistral  profiles/bench_model.py --family mistral (issue 34: the same shapes with a 4096-key
#                 sliding window; model-decode-mistral-DATE-COMMIT; ~4-8 min cold compile cache)  [MODEL_MISTRAL_S]
#   bench-train   profiles/bench_train.py (issue 33: a training step of a Llama-3-8B-shaped model, ours with and without
#                 patch_linear vs HF sdpa on torch's flash / cuDNN / efficient backends, paired, attention / GEMM /
#                 rest split; ~85 GB of device memory, ~3-5 min cold compile cache)            [TRAIN_S, TRAIN_ARGS]
#   demo          cute-kernels demo (GPU: each kernel vs PyTorch, error and speed)
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export CUTE_KERNELS_CACHE_DIR=${CUTE_KERNELS_CACHE_DIR:-/tmp/ck-cache}
# Unbuffered: a step killed by its timeout keeps what it printed (block-buffered output into a pipe or
# file is lost with the process: a timed-out pytest shows no progress at all).
export PYTHONUNBUFFERED=1
commit=${CK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}  # pass CK_COMMIT: the copy's .git may be stale
{ echo "commit $commit (+ uncommitted: $(git status --porcelain 2>/dev/null | wc -l) files)"; date -u;
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv; } > "$OUT/session.log"
py() { timeout "$1" python3 "${@:2}"; }
quiet() { grep -v "Warning:\|warnings.warn"; }
gpu_tests() {  # gpu_tests SECONDS LOG PATH... [pytest args]: GPU tests on GPU_TESTS_N workers (default 8), the tail into $OUT/LOG
  local s=$1 log=$2; shift 2
  # -v, its PASSED / SKIPPED lines dropped: a FAILED line shows as it happens, so a run its timeout cuts
  # still names its failures (the summary comes only at the end)
  py "$s" -m pytest -v -m gpu -n "${GPU_TESTS_N:-8}" -p no:cacheprovider -p no:warnings --tb=short "$@" 2>&1 \
    | grep -Ev "^DEBUG |^INFO | PASSED | SKIPPED |PytestBenchmarkWarning|warner\(|^tests/" | tail -n 200 | tee "$OUT/$log"
}
for step in "$@"; do
  echo "=== $step $(date -u +%T)" | tee -a "$OUT/session.log"
  case $step in
    all-tests) gpu_tests "${TESTS_S:-540}" gpu-tests.log tests ;;
    gemm-tests) gpu_tests "${GEMM_TESTS_S:-400}" gemm-tests.log tests/gemm ;;
    attn-tests) gpu_tests "${ATTN_TESTS_S:-300}" attn-tests.log tests/attention ;;
    paged-tests) gpu_tests "${PAGED_TESTS_S:-240}" paged-tests.log tests/attention/test_forward_paged.py ;;
    attn-k) gpu_tests "${PYTEST_S:-300}" attn-k.log tests/attention -k "$PYTEST_K" ;;
    gemm-k) gpu_tests "${PYTEST_S:-300}" gemm-k.log tests/gemm -k "$PYTEST_K" ;;
    decode-tests) gpu_tests "${DECODE_TESTS_S:-300}" decode-tests.log tests/attention/test_decode.py \
      tests/attention/test_decode_args.py tests/attention/test_decode_window.py ;;
    backward-tests) gpu_tests "${BWD_TESTS_S:-300}" backward-tests.log tests/attention/test_backward.py \
      tests/attention/test_backward_compile.py tests/attention/test_flash_autograd.py \
      tests/attention/test_backward_varlen.py ;;
    backward-d256) gpu_tests "${BWD_D256_S:-200}" backward-d256.log tests/attention/test_backward.py \
      tests/attention/test_flash_autograd.py tests/attention/test_backward_varlen.py -k 256
      CK_COMMIT=$commit py 150 profiles/bench_attention.py --backward --only d256 --out-dir "$OUT" 2>&1 | quiet \
        | tee "$OUT/bench-attention-backward-d256.log" ;;
    host-tests) gpu_tests "${HOST_TESTS_S:-300}" host-tests.log tests/attention/test_host_path_gpu.py \
      tests/attention/test_decode.py tests/attention/test_decode_args.py ;;
    variant-tests) gpu_tests "${VARIANT_TESTS_S:-240}" variant-tests.log tests/attention/test_variants.py \
      tests/attention/test_variants_compile.py ;;
    hf-tests) gpu_tests "${HF_TESTS_S:-200}" hf-tests.log tests/integrations ;;
    stress|sanitize) { py "${STRESS_WARM_S:-400}" profiles/stress.py --precompile ${STRESS_ARGS:-} 2>&1 | quiet
                for tool in ${STRESS_TOOLS:-memcheck racecheck synccheck}; do echo "--- compute-sanitizer --tool $tool $(date -u +%T)"
                  CK_SANITIZER=$tool timeout "${STRESS_S:-150}" compute-sanitizer --tool "$tool" --error-exitcode 99 \
                    python3 profiles/stress.py ${STRESS_ARGS:-} 2>&1 | grep -v "UserWarning\|DeprecationWarning\|warnings.warn" | tail -n 120
                  echo "--- $tool exit ${PIPESTATUS[0]} $(date -u +%T)"; done; } | tee "$OUT/stress.log" ;;
    sweep) CK_COMMIT=$commit py "${SWEEP_S:-480}" profiles/sweep.py --out "$OUT" ${SWEEP_ARGS:-} 2>&1 | quiet | tee "$OUT/sweep.log" ;;
    sweep-quick) CK_COMMIT=$commit py 300 profiles/sweep.py --quick --out "$OUT" ${SWEEP_ARGS:-} 2>&1 | quiet | tee "$OUT/sweep.log" ;;
    bench-gemm) py "${BENCH_S:-400}" profiles/bench_gemm.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 | quiet | tee "$OUT/bench-gemm.log" ;;
    bench-attention) CK_COMMIT=$commit py "${BENCH_S:-400}" profiles/bench_attention.py --out-dir "$OUT" 2>&1 | quiet | tee "$OUT/bench-attention.log" ;;
    bench-attention-varlen) CK_COMMIT=$commit py "${BENCH_VARLEN_S:-420}" profiles/bench_attention.py --varlen --out-dir "$OUT" ${BENCH_VARLEN_ARGS:-} 2>&1 | quiet | tee "$OUT/bench-attention-varlen.log" ;;
    bench-attention-backward-varlen) CK_COMMIT=$commit py "${BENCH_BWD_VARLEN_S:-420}" profiles/bench_attention.py --backward --varlen --out-dir "$OUT" ${BENCH_BWD_VARLEN_ARGS:-} 2>&1 | quiet | tee "$OUT/bench-attention-backward-varlen.log" ;;
    bench-attention-backward) CK_COMMIT=$commit py "${BENCH_BWD_S:-420}" profiles/bench_attention.py --backward --out-dir "$OUT" 2>&1 | quiet | tee "$OUT/bench-attention-backward.log" ;;
    bench-gemm-tune) py 500 profiles/bench_gemm.py --tune --out "$OUT" 2>&1 | quiet | tee "$OUT/bench-gemm.log" ;;
    bench-gemm-decode) py "${BENCH_S:-300}" profiles/bench_gemm.py --preset decode --out "$OUT" 2>&1 | quiet | tee "$OUT/bench-gemm-decode.log" ;;
    gemm-stage-cand) py 300 profiles/bench_gemm.py --out "$OUT" --repeats 5 --shapes 4097x127x1000,4096x4096x4100,1000x3000x522 --configs default:stage 2>&1 | quiet | tee "$OUT/gemm-stage-cand.log" ;;
    gemm-raster-cand) py 300 profiles/bench_gemm.py --out "$OUT" --repeats 5 --shapes 4096x4096x4096,4096x14336x4096 --configs 128x256:2x1:8m,128x256:2x1:8n 2>&1 | quiet | tee "$OUT/gemm-raster-cand.log" ;;
    ab-gemm) py "${AB_S:-300}" profiles/ab_gemm.py --out "$OUT" ${AB_ARGS:-} 2>&1 | quiet | tee "$OUT/ab-gemm.log" ;;
    ab-gemm2) py "${AB2_S:-200}" profiles/ab_gemm.py --out "$OUT" --tag ab2 ${AB2_ARGS:-} 2>&1 | quiet | tee "$OUT/ab-gemm2.log" ;;
    ab-gemm-224) py 150 -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/gemm/test_gemm.py -k tile_224 2>&1 | tail -n 15 | tee "$OUT/ab-gemm-224.log"
      py "${AB224_S:-360}" profiles/ab_gemm.py --out "$OUT" --tag t224 --iters 150 \
        --shapes 3x1000x1000x1000,1000x3584x1024,2048x1792x1024,2048x5000x1024,3000x7168x1024,4096x3584x4096 \
        --variants default,cuBLAS,128x224:2x1,128x224:1x1,128x256:2x1 2>&1 | quiet | tee -a "$OUT/ab-gemm-224.log" ;;
    ab-gemm-parts) py 240 -m pytest -q -n 4 -m gpu -p no:cacheprovider tests/gemm/test_gemm.py -k "fixup_numerics and parts" 2>&1 | tail -n 15 | tee "$OUT/ab-gemm-parts.log"
      py "${ABPARTS_S:-300}" profiles/ab_gemm.py --out "$OUT" --tag parts --iters 150 \
        --shapes 1024x1024x32768,512x512x65536,768x1024x16384,512x1536x12288,256x512x32768,512x4096x14336 \
        --variants default,default:parts,cuBLAS,128x256:2x1:s2:parts 2>&1 | quiet | tee -a "$OUT/ab-gemm-parts.log" ;;
    ab-commits) before="${BEFORE:-.ab_before}"
      if [ -n "${BEFORE_PATCH:-}" ]; then  # the before tree as this tree minus a patch (no second tree to carry)
        before=$(mktemp -d); cp -r cute_kernels layouts "$before"/
        (cd "$before" && git apply -R "$OLDPWD/$BEFORE_PATCH" 2>&1 || patch -R -p1 < "$OLDPWD/$BEFORE_PATCH") | tail -n 5
        if diff -rq cute_kernels "$before/cute_kernels" > /dev/null && diff -rq layouts "$before/layouts" > /dev/null; then
          echo "ab-commits: BEFORE_PATCH changed nothing (not applied?): skipped" | tee "$OUT/ab-commits.log"; continue
        fi
      fi
      py "${AB_COMMITS_S:-500}" profiles/ab_commits.py --before "$before" --after . \
        --what "${AB_WHAT:-gemm,gemm_decode,decode}" --rounds "${AB_ROUNDS:-3}" --out "$OUT" 2>&1 | quiet | tee "$OUT/ab-commits.log" ;;
    bench-decode) py 400 profiles/bench_decode.py --out-dir "$OUT" 2>&1 | quiet | tee "$OUT/bench-decode.log" ;;
    ab-backward-det) py 200 -m pytest -q -n 8 -m gpu -p no:cacheprovider tests/attention/test_backward.py -k "deterministic or dq_warps" 2>&1 | tail -n 15 | tee "$OUT/ab-backward-det-tests.log"
      CK_COMMIT=$commit py "${AB_BWD_S:-300}" profiles/ab_backward.py --variants det,det2w,det2wg --out "$OUT" 2>&1 | quiet | tee "$OUT/ab-backward-det.log" ;;
    ab-backward-carry) py 200 -m pytest -q -n 8 -m gpu -p no:cacheprovider tests/attention/test_backward.py tests/attention/test_backward_varlen.py -k "dk_carry or dv_early or step_variants or lpt_order or kv_reduce" 2>&1 | tail -n 15 | tee "$OUT/ab-backward-carry-tests.log"
      CK_COMMIT=$commit py "${AB_BWD_S:-360}" profiles/ab_backward.py --variants bound,dvearly,tm64early,lpt,kvreduce,qdoearly,carryearly,qdo,carry --out "$OUT" 2>&1 | quiet | tee "$OUT/ab-backward-carry.log" ;;
    ab-attention-prefetch) py 200 -m pytest -q -n 6 -m gpu -p no:cacheprovider tests/attention/test_forward.py -k prefetch_tile 2>&1 | tail -n 15 | tee "$OUT/ab-attention-prefetch.log"
      py "${AB_PREFETCH_S:-360}" profiles/ab_attention.py --rounds 5 --shapes b32_hq32_hkv8_s512_d128_causal,b16_h16_s1024_d128_causal,b4_h32_s4096_d128_causal,b4_h32_s4096_d128_full \
        --out "$OUT/ab-attention-prefetch.json" 2>&1 | quiet | tee -a "$OUT/ab-attention-prefetch.log" ;;
    ab-attention-softcap) py "${AB_ATTN_S:-400}" profiles/ab_attention.py --softcap 30 --rounds 5 --out "$OUT/ab-attention-softcap.json" 2>&1 | quiet | tee "$OUT/ab-attention-softcap.log" ;;
    ab-attention-psmem) py 200 -m pytest -q -n 6 -m gpu -p no:cacheprovider tests/attention/test_forward.py -k p_smem 2>&1 | tail -n 15 | tee "$OUT/ab-attention-psmem.log"
      py "${AB_PSMEM_S:-360}" profiles/ab_attention.py --rounds 5 --shapes b3_hq24_hkv8_s5000_d96_full,b4_h32_s4096_d96_causal \
        --out "$OUT/ab-attention-psmem.json" 2>&1 | quiet | tee -a "$OUT/ab-attention-psmem.log" ;;
    bench-variants) CK_COMMIT=$commit py "${VARIANTS_S:-300}" profiles/bench_variants.py --out "$OUT" 2>&1 | quiet | tee "$OUT/bench-variants.log" ;;
    bench-gaps) CK_COMMIT=$commit py "${GAPS_S:-400}" profiles/bench_gaps.py --out-dir "$OUT" 2>&1 | quiet | tee "$OUT/bench-gaps.log" ;;
    bench-quick) CK_COMMIT=$commit py "${QUICK_S:-420}" -m cute_kernels bench all --quick --out "$OUT" 2>&1 | quiet | tee "$OUT/bench-quick.log" ;;
    bench-test) CK_COMMIT=$commit py "${BENCH_TEST_S:-700}" -m pytest -q -m gpu -p no:cacheprovider tests/tools/test_bench.py 2>&1 | grep -v Warning | tail -n 40 | tee "$OUT/bench-test.log" ;;
    read-ceiling) py "${CEIL_S:-300}" profiles/read_ceiling.py --out "$OUT" 2>&1 | quiet | tee "$OUT/read-ceiling.log" ;;
    host) CK_COMMIT=$commit py 200 profiles/bench_host.py --out "$OUT" 2>&1 | tee "$OUT/bench-host.log" ;;
    host-ab) before=$(cd "${BEFORE:-.ab_before}" && pwd); pin="taskset -c ${HOST_AB_CPU:-3}"  # both sides on one core
      for r in $(seq "${HOST_AB_RUNS:-2}"); do
        echo "--- round $r: before ($before)"; (cd "$before" && PYTHONPATH="$before:$PYTHONPATH" CK_COMMIT=before \
          timeout 200 $pin python3 profiles/bench_host.py --no-first-call --out /tmp/host-ab-before)
        echo "--- round $r: after ($commit)"; CK_COMMIT=$commit timeout 200 $pin python3 profiles/bench_host.py --no-first-call --out /tmp/host-ab-after
      done 2>&1 | quiet | tee "$OUT/host-ab.log" ;;
    host-ab2) CK_COMMIT=$commit py "${HOST_AB2_S:-300}" profiles/host_ab.py --before "${BEFORE:-.ab_before}" --after . \
      --rounds "${HOST_AB2_ROUNDS:-60}" --calls 200 --cpu "${HOST_AB_CPU:-3}" --out "$OUT" 2>&1 | quiet | tee "$OUT/host-ab2.log" ;;
    import-time) before=$(cd "${BEFORE:-.ab_before}" 2>/dev/null && pwd)
      for r in $(seq "${IMPORT_RUNS:-5}"); do
        for what in torch cute_kernels; do
          t0=$(date +%s.%N); python3 -c "import $what"; t1=$(date +%s.%N); echo "after  import $what $(awk "BEGIN{print $t1 - $t0}")"
          if [ -n "$before" ]; then t0=$(date +%s.%N); (cd "$before" && PYTHONPATH="$before:$PYTHONPATH" python3 -c "import $what")
            t1=$(date +%s.%N); echo "before import $what $(awk "BEGIN{print $t1 - $t0}")"; fi
        done
      done 2>&1 | tee "$OUT/import-time.log"
      python3 -c "import cute_kernels, sys; print('after: cutlass imported by import cute_kernels:', 'cutlass' in sys.modules)" \
        2>&1 | tee -a "$OUT/import-time.log"
      # the package's own share, free of the host's process-start noise: -X importtime's cumulative us of
      # the top-level cute_kernels import minus those of torch inside it (3 runs)
      for r in 1 2 3; do python3 -X importtime -c "import cute_kernels" 2>&1 | awk -F'|' '
        $3 ~ /^ *torch$/ {t=$2} $3 ~ /^ *cute_kernels$/ {c=$2}
        END {printf "importtime: cute_kernels %.3f s, torch within it %.3f s, own %.3f s\n", c/1e6, t/1e6, (c-t)/1e6}'
      done 2>&1 | tee -a "$OUT/import-time.log" ;;
    bench-generate) CK_COMMIT=$commit timeout "${GEN_S:-300}" taskset -c "${HOST_AB_CPU:-3}" python3 profiles/bench_generate.py \
      --rounds 9 --out "$OUT" ${GEN_ARGS:-} 2>&1 | quiet | tee "$OUT/bench-generate.log" ;;
    bench-model) CK_COMMIT=$commit py "${MODEL_S:-480}" profiles/bench_model.py --out "$OUT" 2>&1 | quiet | tee "$OUT/bench-model.log" ;;
    bench-model-mistral) CK_COMMIT=$commit py "${MODEL_MISTRAL_S:-540}" profiles/bench_model.py --family mistral --out "$OUT" 2>&1 | quiet | tee "$OUT/bench-model-mistral.log" ;;
    bench-train) CK_COMMIT=$commit py "${TRAIN_S:-540}" profiles/bench_train.py --out-dir "$OUT" ${TRAIN_ARGS:-} 2>&1 | quiet | tee "$OUT/bench-train.log" ;;
    demo) py 300 -m cute_kernels demo 2>&1 | quiet | tee "$OUT/demo.log" ;;
    *) echo "unknown step: $step (see the list at the top of profiles/gpu_session.sh)" | tee -a "$OUT/session.log" ;;
  esac
done
