#!/usr/bin/env bash
# The prepared GPU check (issues 8 and 20): ONE command for a lent GPU machine. It runs the CUDA
# tests and benchmark from binaries built here beforehand (carried in; rebuilt there only when they
# do not load), GPU tests first, each in its own process with every launch synchronised
# (QFORGE_CUDA_SYNC=1: a fault is reported at the launch of the kernel that made it), then a
# compute-sanitizer memcheck over a trimmed subset, then the host tests, the backend-equivalence
# sweep and the benchmark (GEMV bandwidth per qtype, GEMM paths vs cuBLAS fp16, Llama-3-8B-shape
# decode and prefill, the GEMV tilings; qforge_cuda_bench's header), and with --profile ncu's
# per-kernel times of decode steps. A failing GPU test skips the benchmark (its minutes go to the next try). It leaves a log
# and the table under $OUT; the last line is `ALL GPU CHECKS PASSED` only when every GPU test
# ran and passed (none skipped) and memcheck ran clean.
#
# Before the lease, here (Debian, apt, a built qforge; about 10 minutes on 2 cores):
#     scripts/fetch_gpu_check_deps.sh --qforge build/cli/qforge
#     scripts/gpu_check.sh --arch 90 --jobs 2 --prebuild
# which builds the CUDA-only configuration for sm_90 (H100/H200) in build-gpu-check and copies
# the two binaries to out/gpu_prebuilt. Then the lead's call of the device tool (`run`), exactly:
#     command:   bash scripts/gpu_check.sh
#     carry:     ["third_party/debs/root", "third_party/gpu_check_data", "out/gpu_prebuilt"]
#     timeout_s: 540
# What comes back ($OUT): gpu_check.log (everything), gpu_tests.log (each GPU test's output),
# memcheck.log, host_tests.log, gpu_check_table.txt (the table), backend_ops_table.txt (the
# backend-equivalence sweep's errors per op and qtype), build.log when it had to build.
# Rerun the same call after a fix (rebuild out/gpu_prebuilt here first); give the machine back.
#
# Rehearsal without a GPU (every stage runs; the GPU tests skip, so the last line is absent):
#     scripts/gpu_check.sh --quick --timeout-scale 6
#
# Options:
#   --arch A        CMAKE_CUDA_ARCHITECTURES when building (default: native, this machine's GPU)
#   --jobs N        build parallelism (default: all cores)
#   --build-dir D   (default: build-gpu-check; reused, never removed)
#   --prebuilt D    the carried binaries (default: out/gpu_prebuilt); used when both load
#   --prebuild      build, copy the binaries to the --prebuilt folder, and stop
#   --quick         benchmark at smoke sizes (a rehearsal, not a measurement)
#   --timeout-scale N  multiply every stage's time limit by N (slow rehearsal machines)
#   --skip-tests, --skip-bench
#   --profile       after the benchmark, ncu's per-kernel time summary of q4_g128 decode steps
#                   (4 layers, 4 timed steps: every kernel of a token, and how long each takes)
#   --bench-always  run the benchmark even when a GPU test failed (a first run on a lease that
#                   leaves no time for a second: its figures are then marked as such)
# Environment: OUT (default out/gpu_check), QFORGE_DEPS_ROOT (default third_party/debs/root),
# QFORGE_GPU_CHECK_DATA (default third_party/gpu_check_data).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

arch=native
jobs=$(nproc 2>/dev/null || echo 4)
build=build-gpu-check
prebuilt=out/gpu_prebuilt
prebuild=0
quick=0
run_tests=1
run_bench=1
bench_always=0
profile=0
scale=1
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="${2:?--arch needs a value}"; shift 2 ;;
    --jobs) jobs="${2:?--jobs needs a value}"; shift 2 ;;
    --build-dir) build="${2:?--build-dir needs a value}"; shift 2 ;;
    --prebuilt) prebuilt="${2:?--prebuilt needs a value}"; shift 2 ;;
    --prebuild) prebuild=1; shift ;;
    --quick) quick=1; shift ;;
    --timeout-scale) scale="${2:?--timeout-scale needs a value}"; shift 2 ;;
    --skip-tests) run_tests=0; shift ;;
    --skip-bench) run_bench=0; shift ;;
    --bench-always) bench_always=1; shift ;;
    --profile) profile=1; shift ;;
    -h|--help) sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for v in "$jobs" "$scale"; do
  case "$v" in ''|0|*[!0-9]*) echo "gpu_check: --jobs and --timeout-scale take a positive number, not '$v'" >&2; exit 2 ;; esac
done

OUT=${OUT:-$root/out/gpu_check}
mkdir -p "$OUT"
log="$OUT/gpu_check.log"
: >"$log"
say() { echo "gpu_check: $*" | tee -a "$log"; }
deps=${QFORGE_DEPS_ROOT:-$root/third_party/debs/root}
data=${QFORGE_GPU_CHECK_DATA:-$root/third_party/gpu_check_data}
case "$deps" in /*) ;; *) deps="$root/$deps" ;; esac
case "$data" in /*) ;; *) data="$root/$data" ;; esac
case "$prebuilt" in /*) ;; *) prebuilt="$root/$prebuilt" ;; esac
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start ))s; }

# ---- the machine ---------------------------------------------------------------------------
{
  echo "== machine"
  (nvidia-smi -L || echo "nvidia-smi: not available") 2>&1
  nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.sm,driver_version --format=csv 2>&1 || true
  (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>&1) | tail -2
  cmake --version 2>&1 | head -1
  (ninja --version 2>/dev/null | sed 's/^/ninja /') || echo "ninja: not found (Unix Makefiles)"
  c++ --version 2>&1 | head -1
  echo "cores: $(nproc), arch: $arch, deps: $deps, data: $data"
} 2>&1 | tee -a "$log"

status=0
if [ ! -d "$deps/usr/include" ]; then
  say "FAIL: $deps holds no unpacked packages: run scripts/fetch_gpu_check_deps.sh here first and carry third_party/debs/root"
  exit 1
fi
[ -d "$data" ] || say "note: $data is absent: the stories260K tests will skip"

# ---- binaries: the carried ones, or a build ----------------------------------------------------
# The static dependencies come from $deps; the binaries need only the CUDA runtime the machine
# has. A carried binary that does not start (another CUDA major version, a missing library) is
# rebuilt here, in $build, which is reused when present (never removed).
export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
starts() {  # starts BINARY: the bench answers --help with status 0
  [ -x "$1" ] && timeout 60 "$1" --help >/dev/null 2>&1
}
lists() {  # lists BINARY: the Catch2 tests list their names (the status is the count, not 0)
  [ -x "$1" ] && [ -n "$(timeout 60 "$1" --list-test-names-only 2>/dev/null | head -1)" ]
}
tests_bin="$prebuilt/qforge_cuda_tests"
bench_bin="$prebuilt/qforge_cuda_bench"
if [ "$prebuild" = 0 ] && lists "$tests_bin" && starts "$bench_bin"; then
  say "using the carried binaries in $prebuilt ($(elapsed)): $(cat "$prebuilt/BUILT" 2>/dev/null)"
else
  [ "$prebuild" = 0 ] && say "the carried binaries in $prebuilt are absent or do not load: building"
  generator=()
  command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
  nvcc_path=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  say "configure ($(elapsed))"
  configure() {
    timeout $((60 * scale)) cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DQFORGE_GPU_CHECK_BUILD=ON -DQFORGE_DEPS_ROOT="$deps" -DQFORGE_CUDA=ON \
      -DCMAKE_CUDA_COMPILER="$nvcc_path" -DCMAKE_CUDA_ARCHITECTURES="$arch" \
      -DCMAKE_POLICY_VERSION_MINIMUM=3.5 >>"$OUT/build.log" 2>&1
  }
  : >"$OUT/build.log"
  if ! configure; then
    # A cache from another machine or generator: start the configuration (not the objects) over.
    rm -f "$build/CMakeCache.txt"
    if ! configure; then
      tail -30 "$OUT/build.log" | tee -a "$log"
      say "FAIL: configure (log: build.log)"
      exit 1
    fi
  fi
  say "build with $jobs jobs ($(elapsed))"
  if ! timeout $((210 * scale)) cmake --build "$build" -j "$jobs" >>"$OUT/build.log" 2>&1; then
    grep -E "error|Error" -A4 "$OUT/build.log" | head -60 | tee -a "$log"
    say "FAIL: build (log: build.log)"
    exit 1
  fi
  say "built ($(elapsed))"
  tests_bin="$build/tests/qforge_cuda_tests"
  bench_bin="$build/bench/qforge_cuda_bench"
  if [ "$prebuild" = 1 ]; then
    mkdir -p "$prebuilt"
    for b in "$tests_bin" "$bench_bin"; do
      if ! cp "$b" "$prebuilt/" || ! strip "$prebuilt/$(basename "$b")"; then
        say "FAIL: could not copy $b to $prebuilt"
        exit 1
      fi
    done
    echo "$(git describe --always --dirty 2>/dev/null) sm_$arch $(date -u +%F)" >"$prebuilt/BUILT"
    say "prebuilt: $(du -sh "$prebuilt" | cut -f1) in $prebuilt ($(cat "$prebuilt/BUILT")); carry it with the deps"
    exit 0
  fi
fi

# ---- GPU tests first, one process each, launches synchronised ---------------------------------
# Each "[cuda]" test case runs alone (a device fault cannot take the others with it) with
# QFORGE_CUDA_SYNC=1, so a fault names the launch that made it. Counted: passed, failed, skipped
# (no device: the test prints SKIPPED).
gpu_pass=0 gpu_fail=0 gpu_skip=0
tests_line="tests: not run"
if [ "$run_tests" = 1 ]; then
  say "GPU tests ($(elapsed))"
  : >"$OUT/gpu_tests.log"
  mapfile -t gpu_tests < <("$tests_bin" --list-test-names-only "[cuda]" 2>/dev/null | sed '/^$/d')
  for t in "${gpu_tests[@]}"; do
    # Catch2 reads commas in a test spec as "or", so escape them
    spec=${t//,/\\,}
    # -w NoTests: a spec that matches nothing fails instead of passing. In sync mode the backend
    # captures no graphs, so a test about graphs runs a second time without it.
    QFORGE_CUDA_SYNC=1 QFORGE_GPU_CHECK_DATA="$data" timeout $((60 * scale)) \
        "$tests_bin" -w NoTests "$spec" >"$OUT/one_test.log" 2>&1
    rc=$?
    case "$t" in
      *graph*)
        if [ $rc -eq 0 ] && ! grep -q "SKIPPED:" "$OUT/one_test.log"; then
          echo "== $t, again without QFORGE_CUDA_SYNC (graphs on)" >>"$OUT/one_test.log"
          QFORGE_GPU_CHECK_DATA="$data" timeout $((60 * scale)) \
              "$tests_bin" -w NoTests "$spec" >>"$OUT/one_test.log" 2>&1
          rc=$?
        fi
        ;;
    esac
    { echo "== $t (rc $rc)"; cat "$OUT/one_test.log"; } >>"$OUT/gpu_tests.log"
    if [ $rc -ne 0 ]; then
      gpu_fail=$((gpu_fail + 1))
      say "FAILED: $t (rc $rc)"
      grep -E "FAILED|error|Error|with expansion" -A3 "$OUT/one_test.log" | head -20 | tee -a "$log"
    elif grep -q "SKIPPED:" "$OUT/one_test.log"; then
      gpu_skip=$((gpu_skip + 1))
    else
      gpu_pass=$((gpu_pass + 1))
    fi
  done
  rm -f "$OUT/one_test.log"
  tests_line="GPU tests: ${#gpu_tests[@]} cases, $gpu_pass passed, $gpu_fail failed, $gpu_skip skipped"
  say "$tests_line ($(elapsed))"
  [ "$gpu_skip" -gt 0 ] && say "skipped: $(grep -m1 'SKIPPED:' "$OUT/gpu_tests.log")"
  [ "$gpu_fail" -gt 0 ] && status=1
fi

# ---- memcheck over a trimmed subset ----------------------------------------------------------
# compute-sanitizer's memcheck runs 10-100x slower: the kernel-level tests only (every kernel
# family once), not the whole backend.
memcheck_line="memcheck: not run"
memcheck_clean=0
if [ "$run_tests" = 1 ]; then
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  if [ -z "$sanitizer" ]; then
    memcheck_line="memcheck: not run (compute-sanitizer not found)"
  elif [ "$gpu_pass" = 0 ]; then
    memcheck_line="memcheck: not run (no GPU test passed)"
  else
    say "memcheck ($(elapsed))"
    # One spec, the names joined by commas (Catch2 reads separate arguments as "and"; commas
    # inside a name escaped); -w NoTests fails a spec that matches nothing.
    memcheck_tests="CUDA matmul adds the bias and accumulates into the output"
    memcheck_tests+=",CUDA embedding lookup and fp16 dequantization are exact"
    memcheck_tests+=",CUDA RMSNorm\\, SwiGLU\\, residual add and argmax match the CPU formulas"
    memcheck_tests+=",CUDA RoPE\\, fp16 cache writes and attention match the CPU"
    memcheck_tests+=",CUDA RMSNorm and SwiGLU with int8 blocks equal the separate preparation"
    memcheck_tests+=",CUDA RoPE and attention through per-row caches equal each row alone"
    QFORGE_GPU_CHECK_DATA="$data" timeout $((150 * scale)) "$sanitizer" --tool memcheck \
        --error-exitcode 86 --leak-check no "$tests_bin" -w NoTests "$memcheck_tests" \
        >"$OUT/memcheck.log" 2>&1
    rc=$?
    tail -3 "$OUT/memcheck.log" | tee -a "$log"
    if [ $rc -eq 0 ] && ! grep -q "SKIPPED:" "$OUT/memcheck.log"; then
      memcheck_line="memcheck: clean"
      memcheck_clean=1
    else
      memcheck_line="memcheck: FAILED (rc $rc; log: memcheck.log)"
      status=1
    fi
  fi
  say "$memcheck_line"
fi

# ---- host tests ------------------------------------------------------------------------------
if [ "$run_tests" = 1 ]; then
  say "host tests ($(elapsed))"
  timeout $((60 * scale)) "$tests_bin" "[cuda_host]" >"$OUT/host_tests.log" 2>&1
  rc=$?
  tail -2 "$OUT/host_tests.log" | tee -a "$log"
  if [ $rc -ne 0 ]; then
    status=1
    say "FAIL: host tests (rc $rc; log: host_tests.log)"
  fi
fi

# ---- backend-equivalence sweep ---------------------------------------------------------------
# Every operation of the forward pass on CUDA (and on the CPU, for comparison) x every qtype x
# odd shapes, against a float64 reference (tests/backend_ops_test.cpp); the table is the largest
# |error| / bound per operation and qtype (a value above 1 fails).
ops_table="$OUT/backend_ops_table.txt"
if [ "$run_tests" = 1 ]; then
  say "backend ops sweep ($(elapsed))"
  timeout $((60 * scale)) "$tests_bin" "[backend_ops]" >"$ops_table" 2>&1
  rc=$?
  tee -a "$log" <"$ops_table"
  if [ $rc -ne 0 ]; then
    status=1
    say "FAIL: backend ops sweep (rc $rc; table: backend_ops_table.txt)"
  fi
fi

# ---- benchmark -------------------------------------------------------------------------------
table="$OUT/gpu_check_table.txt"
if [ "$run_bench" = 1 ] && [ "$gpu_fail" -gt 0 ] && [ "$bench_always" = 0 ]; then
  say "benchmark skipped: $gpu_fail GPU test(s) failed"
elif [ "$run_bench" = 1 ]; then
  say "benchmark ($(elapsed))"
  [ "$gpu_fail" -gt 0 ] && say "note: $gpu_fail GPU test(s) failed: the figures below come from kernels that failed a test"
  bench_args=(--out "$table")
  [ "$quick" = 1 ] && bench_args+=(--quick)
  timeout $((120 * scale)) "$bench_bin" "${bench_args[@]}" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    status=1
    say "FAIL: benchmark (rc $rc)"
  fi
fi

# ---- profile: where a decode token's time goes ----------------------------------------------
# ncu times every kernel of q4_g128 decode steps (serialised, so the sum of kernel times against
# the benchmark's token time shows the launch gaps); a 4-layer model keeps it short.
if [ "$profile" = 1 ]; then
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
  if [ -z "$ncu" ]; then
    say "profile: not run (ncu not found)"
  else
    say "profile ($(elapsed))"
    prof_args=(--sections decode --qtypes q4_g128 --decode-layers 4 --decode-steps 4)
    "$bench_bin" "${prof_args[@]}" >"$OUT/profile.log" 2>&1
    timeout $((120 * scale)) "$ncu" --metrics gpu__time_duration.sum --print-summary per-kernel \
        "$bench_bin" "${prof_args[@]}" >>"$OUT/profile.log" 2>&1
    say "profile: rc $? (profile.log)"
    # The first layer's down product (the 4th GEMV of a step): its limiters in detail.
    timeout $((60 * scale)) "$ncu" --kernel-name-base function -k regex:gemv_kernel \
        --launch-skip 3 --launch-count 1 --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        "$bench_bin" "${prof_args[@]}" >>"$OUT/profile.log" 2>&1
    say "profile of one GEMV: rc $? (profile.log)"
  fi
fi

# ---- summary ---------------------------------------------------------------------------------
all_passed=0
[ "$status" = 0 ] && [ "$gpu_pass" -gt 0 ] && [ "$gpu_fail" = 0 ] && [ "$gpu_skip" = 0 ] &&
  [ "$memcheck_clean" = 1 ] && all_passed=1
{
  echo
  echo "== gpu_check summary ($(elapsed))"
  echo "$tests_line"
  echo "$memcheck_line"
  [ -s "$ops_table" ] && grep -E "^(backend|cuda)" "$ops_table"
  [ -s "$table" ] && cat "$table"
  [ "$status" = 0 ] && echo "gpu_check: OK" || echo "gpu_check: FAILED (see above)"
  [ "$all_passed" = 1 ] && echo "ALL GPU CHECKS PASSED"
} 2>&1 | tee -a "$log"
if [ -s "$table" ]; then
  printf '\n%s\n%s\n' "$tests_line" "$memcheck_line" >>"$table"
fi
exit "$status"
