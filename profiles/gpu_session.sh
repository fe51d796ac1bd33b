#!/bin/bash
# One device call: GPU tests, then benchmarks.  Logs and results land in $OUT (at most 8 files).
#   source .device/setup.sh && bash profiles/gpu_session.sh STEP...
# steps: oddk cpasync all-tests gemm-tests attn-tests tile-tests sanitize bench-gemm bench-gemm-tune bench-decode host demo
#        (all-tests = gemm-tests + attn-tests + tile-tests: ~700 GPU tests, more than one call's 600 s now)
#        t256 (256-row tiles: smoke, tests, timing) decode-tma (repro of the fixed TMA decode path)
#        power (sustained GEMM: TFLOP/s, SM clock and power per implementation, profiles/bench_power.py)
#        l2hint (L2 evict-first hint on streamed operands: split-K B, decode K/V; four timers)
#        bench-decode-cand (bench-decode + a cute_$DECODE_CAND column, default tma_ef: TMA loads with the evict-first hint)
#        attn-tests-tmaef (attn-tests with CUTE_KERNELS_DECODE_LOAD=tma_ef)
#        ncu-gemm (Nsight Compute, one call per GEMM implementation: profiles/ncu_gemm.py, NCU_ARGS)
#        decode-placement (is the b1 do_bench bimodality K/V placement? profiles/decode_placement.py)
#        ab-gemm (paired call-by-call A/B of GEMM variants under do_bench's flush: profiles/ab_gemm.py, AB_ARGS)
#        decode-size-sweep (b1 at L 8K..128K, default vs SWEEP_CAND columns, default tma_ef: where does the hint stop paying?)
#        gemm-raster-cand (the l2_model.py raster candidates for 4096^3 / 4096x14336, 5 rounds)
#        probe-align (16384x4400x4096: row alignment of B / the output vs aligned neighbours, ALIGN_ARGS)
#        ab-gemm2 / ab-gemm3 (more ab_gemm.py calls: AB2_ARGS / AB3_ARGS)
#        splitk-mc-tests (cluster split-K with A multicast along N: GPU numerics of the mc variants)
#        bench-gemm-decode (bench_gemm.py --preset decode: M <= 64 decode-time shapes), skinny-tests (the transposed plan's GPU tests)
#        occupancy (max resident clusters of 1..16 CTAs at full shared memory: profiles/cluster_occupancy.py)
#        band-tests (GPU tests of the swizzle-8-along-N raster, stream tiles and the raster rule)
#        read-ceiling (the fastest bare read of each open bandwidth target's bytes under do_bench: profiles/read_ceiling.py)
#        tune-tests (the GEMM tuner's GPU tests)
#        gemm-k (test_gemm.py -m gpu -k "$PYTEST_K", PYTEST_S seconds)
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export CUTE_KERNELS_CACHE_DIR=${CUTE_KERNELS_CACHE_DIR:-/tmp/ck-cache}
commit=${CK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}  # pass CK_COMMIT: the copy's .git may be stale
{ echo "commit $commit (+ uncommitted: $(git status --porcelain 2>/dev/null | wc -l) files)"; date -u;
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv; } > "$OUT/session.log"
py() { timeout "$1" python3 "${@:2}"; }
for step in "$@"; do
  echo "=== $step $(date -u +%T)" | tee -a "$OUT/session.log"
  case $step in
    oddk) py 90 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm.py -k odd_k 2>&1 | grep -v Warning | tail -n 8 | tee "$OUT/oddk.log" ;;
    cpasync) CUTE_KERNELS_CPASYNC=1 py 150 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm_cpasync.py 2>&1 | grep -v Warning | tail -n 30 | tee "$OUT/cpasync.log" ;;
    all-tests) py ${TESTS_S:-540} -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | grep -v Warning | tail -n 60 | tee "$OUT/gpu-tests.log" ;;
    sanitize) { py 90 profiles/sanitize.py; for tool in memcheck racecheck synccheck; do echo "--- compute-sanitizer --tool $tool";
                SKIP_DECODE=${SKIP_DECODE:-} timeout 100 compute-sanitizer --tool $tool python3 profiles/sanitize.py 2>&1 | grep -v "UserWarning\|DeprecationWarning\|warnings.warn\|^  " | tail -n 40; done; } | tee "$OUT/sanitize.log" ;;
    t256) py 60 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu tests/test_gemm_tiles256.py -k smoke 2>&1 | tail -n 8 | tee "$OUT/t256-smoke.log" && {
            py 270 -m pytest -q -p no:cacheprovider -p no:warnings -m gpu -rf tests/test_gemm_tiles256.py --deselect tests/test_gemm_tiles256.py::test_tiles256_smoke 2>&1 | tail -n 30 | tee "$OUT/t256-tests.log";
            py 200 profiles/bench_pingpong.py --tiles256 --out "$OUT" 2>&1 | grep -v "Warning:\|warnings.warn" | tail -n 30; } ;;
    decode-tma) py 200 profiles/repro_decode_tma.py --max-hangs 1 2>&1 | tail -n 40 | tee "$OUT/decode-tma.log" ;;
    tile-tests) py 400 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm_pingpong.py tests/test_gemm_tiles256.py 2>&1 | grep -v Warning | tail -n 40 | tee "$OUT/tile-tests.log" ;;
    gemm-tests) py ${GEMM_TESTS_S:-480} -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm.py tests/test_gemm_cpasync.py 2>&1 | grep -v Warning | tail -n 60 | tee "$OUT/gemm-tests.log" ;;
    attn-tests-tmaef) CUTE_KERNELS_DECODE_LOAD=tma_ef py 300 -m pytest -q -m gpu -p no:cacheprovider tests/test_decode.py tests/test_merge.py 2>&1 | grep -v Warning | tail -n 60 | tee "$OUT/attn-tests-tmaef.log" ;;
    ncu-gemm) timeout 300 ncu --profile-from-start off --clock-control none --set full -f -o "$OUT/ncu-gemm" python3 profiles/ncu_gemm.py ${NCU_ARGS:-} 2>&1 | grep -v "Warning:\|warnings.warn" | tail -n 40 | tee "$OUT/ncu-gemm-run.log";
              ncu -i "$OUT/ncu-gemm.ncu-rep" --page details > "$OUT/ncu-gemm-details.txt" 2>&1; ncu -i "$OUT/ncu-gemm.ncu-rep" --page raw --csv > "$OUT/ncu-gemm-raw.csv" 2>&1; rm -f "$OUT/ncu-gemm.ncu-rep" ;;
    decode-size-sweep) py 300 profiles/bench_decode.py --size-sweep --candidate ${SWEEP_CAND:-tma_ef} --tag size-sweep --out-dir "$OUT" 2>&1 | grep -v "Warning:\|warnings.warn" | tee "$OUT/decode-size-sweep.log" ;;
    decode-placement) py 200 profiles/decode_placement.py 2>&1 | grep -v "Warning:\|warnings.warn" | tee "$OUT/decode-placement.log" ;;
    probe-align) py 200 profiles/probe_align.py ${ALIGN_ARGS:-} 2>&1 | grep -v "Warning:\|warnings.warn" | tee "$OUT/probe-align.log" ;;
    band-tests) py 200 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm.py -k "band_raster or stream_tiles or default_raster" 2>&1 | grep -v Warning | tail -n 15 | tee "$OUT/band-tests.log" ;;
    gemm-raster-cand) py 300 profiles/bench_gemm.py --out "$OUT" --repeats 5 --shapes 4096x4096x4096,4096x14336x4096 --configs 128x256:2x1:8m,128x256:2x1:8n 2>&1 | grep -v "Warning:\|warnings.warn\|config: GemmConfig" | tee "$OUT/gemm-raster-cand.log" ;;
    attn-tests) py 300 -m pytest -q -m gpu -p no:cacheprovider tests/test_decode.py tests/test_merge.py 2>&1 | grep -v Warning | tail -n 60 | tee "$OUT/attn-tests.log" ;;
    ab-gemm) py ${AB_S:-300} profiles/ab_gemm.py --out "$OUT" ${AB_ARGS:-} 2>&1 | grep -v "Warning:\|warnings.warn" | tee "$OUT/ab-gemm.log" ;;
    ab-gemm2) py ${AB2_S:-200} profiles/ab_gemm.py --out "$OUT" --tag ab2 ${AB2_ARGS:-} 2>&1 | grep -v "Warning:\|warnings.warn" | tee "$OUT/ab-gemm2.log" ;;
    ab-gemm3) py ${AB3_S:-200} profiles/ab_gemm.py --out "$OUT" --tag ab3 ${AB3_ARGS:-} 2>&1 | grep -v "Warning:\|warnings.warn" | tee "$OUT/ab-gemm3.log" ;;
    splitk-mc-tests) py ${MC_S:-200} -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm.py -k "variant_numerics and mc or a_multicast_numerics" 2>&1 | grep -v Warning | tail -n 30 | tee "$OUT/splitk-mc-tests.log" ;;
    bench-gemm) py ${BENCH_S:-400} profiles/bench_gemm.py --out "$OUT" ${BENCH_ARGS:-} 2>&1 | grep -v "Warning:\|warnings.warn" | tee "$OUT/bench-gemm.log" ;;
    bench-gemm-decode) py ${BENCH_S:-300} profiles/bench_gemm.py --preset decode --out "$OUT" 2>&1 | grep -v "Warning:\|warnings.warn" | tee "$OUT/bench-gemm-decode.log" ;;
    skinny-tests) py 200 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm.py -k "skinny" 2>&1 | grep -v Warning | tail -n 20 | tee "$OUT/skinny-tests.log" ;;
    bench-gemm-tune) py 500 profiles/bench_gemm.py --tune --out "$OUT" 2>&1 | grep -v "Warning:\|warnings.warn" | tee "$OUT/bench-gemm.log" ;;
    bench-decode) py 400 profiles/bench_decode.py --out-dir "$OUT" 2>&1 | grep -v "Warning:\|warnings.warn" | tee "$OUT/bench-decode.log" ;;
    bench-decode-cand) py 400 profiles/bench_decode.py --candidate ${DECODE_CAND:-tma_ef} --out-dir "$OUT" 2>&1 | grep -v "Warning:\|warnings.warn" | tee "$OUT/bench-decode.log" ;;
    power) py ${POWER_S:-250} profiles/bench_power.py --out "$OUT" ${POWER_ARGS:-} 2>&1 | grep -v "Warning:\|warnings.warn" | tee "$OUT/power.log" ;;
    l2hint) py 240 profiles/bench_l2hint.py --out "$OUT" 2>&1 | grep -v "Warning:\|warnings.warn" | tee "$OUT/l2hint.log" ;;
    host) py 200 profiles/bench_host.py 2>&1 | tee "$OUT/bench-host.log" ;;
    occupancy) py 60 profiles/cluster_occupancy.py "$OUT/cluster-occupancy.json" 2>&1 | grep -v "Warning:\|warnings.warn" | tee "$OUT/occupancy.log" ;;
    read-ceiling) py ${CEIL_S:-300} profiles/read_ceiling.py --out "$OUT" 2>&1 | grep -v "Warning:\|warnings.warn" | tee "$OUT/read-ceiling.log" ;;
    tune-tests) py 200 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm.py -k "tune" 2>&1 | grep -v Warning | tail -n 20 | tee "$OUT/tune-tests.log" ;;
    gemm-k) py ${PYTEST_S:-300} -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm.py -k "$PYTEST_K" 2>&1 | grep -v Warning | tail -n 40 | tee "$OUT/gemm-k.log" ;;
    demo) py 300 -m cute_kernels demo 2>&1 | grep -v "Warning:\|warnings.warn" | tee "$OUT/demo.log" ;;
  esac
done
