#!/usr/bin/env bash
# The prepared GPU check (issue 8): ONE command for a lent GPU machine. It configures a CUDA-only
# build for the machine's own GPU, builds the CUDA tests and benchmark, runs the tests, runs the
# benchmark (GEMV bandwidth per qtype, GEMM paths vs cuBLAS fp16, Llama-3-8B-shape decode), and
# leaves a log and the table under $OUT. Expected 3-4 minutes on an H200 (build ~1.5, tests ~1,
# benchmark ~0.5; estimates, not yet measured there); stage limits 60 + 210 + 120 + 120 seconds.
#
# Before the first lease, here (Debian, apt, a built qforge):
#     scripts/fetch_gpu_check_deps.sh --qforge build-cuda/cli/qforge
# Then the lead's call of the device tool (`run`), exactly:
#     command:   bash scripts/gpu_check.sh
#     carry:     ["third_party/debs/root", "third_party/gpu_check_data"]
#     timeout_s: 540
# What comes back ($OUT): gpu_check.log (everything), ctest.log, gpu_check_table.txt (the table),
# backend_ops_table.txt (the backend-equivalence sweep's errors per op and qtype), build.log.
# Rerun the same call after a fix; give the machine back when done.
#
# Rehearsal without a GPU (builds for sm_90, everything skips with a printed reason):
#     scripts/gpu_check.sh --arch 90 --jobs 2 --quick --timeout-scale 6
#
# Options:
#   --arch A        CMAKE_CUDA_ARCHITECTURES (default: native, the GPU of this machine)
#   --jobs N        build parallelism (default: all cores)
#   --build-dir D   (default: build-gpu-check, removed first)
#   --quick         benchmark at smoke sizes (a rehearsal, not a measurement)
#   --timeout-scale N  multiply every stage's time limit by N (slow rehearsal machines)
#   --skip-tests, --skip-bench
# Environment: OUT (default out/gpu_check), QFORGE_DEPS_ROOT (default third_party/debs/root),
# QFORGE_GPU_CHECK_DATA (default third_party/gpu_check_data).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

arch=native
jobs=$(nproc 2>/dev/null || echo 4)
build=build-gpu-check
quick=0
run_tests=1
run_bench=1
scale=1
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch="${2:?--arch needs a value}"; shift 2 ;;
    --jobs) jobs="${2:?--jobs needs a value}"; shift 2 ;;
    --build-dir) build="${2:?--build-dir needs a value}"; shift 2 ;;
    --quick) quick=1; shift ;;
    --timeout-scale) scale="${2:?--timeout-scale needs a value}"; shift 2 ;;
    --skip-tests) run_tests=0; shift ;;
    --skip-bench) run_bench=0; shift ;;
    -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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

# ---- configure and build ---------------------------------------------------------------------
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
nvcc_path=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
rm -rf "$build"
say "configure ($(elapsed))"
if ! timeout $((60 * scale)) cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DQFORGE_GPU_CHECK_BUILD=ON -DQFORGE_DEPS_ROOT="$deps" -DQFORGE_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc_path" -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 >"$OUT/build.log" 2>&1; then
  tail -30 "$OUT/build.log" | tee -a "$log"
  say "FAIL: configure (log: build.log)"
  exit 1
fi
say "build with $jobs jobs ($(elapsed))"
if ! timeout $((210 * scale)) cmake --build "$build" -j "$jobs" >>"$OUT/build.log" 2>&1; then
  grep -E "error|Error" -A4 "$OUT/build.log" | head -60 | tee -a "$log"
  say "FAIL: build (log: build.log)"
  exit 1
fi
say "built ($(elapsed))"

# ---- tests -----------------------------------------------------------------------------------
tests_line="tests: not run"
if [ "$run_tests" = 1 ]; then
  say "tests ($(elapsed))"
  QFORGE_GPU_CHECK_DATA="$data" timeout $((120 * scale)) ctest --test-dir "$build" --output-on-failure \
      -j 4 --timeout $((110 * scale)) >"$OUT/ctest.log" 2>&1
  rc=$?
  grep -E "tests passed|tests failed|Skipped|Failed|\*\*\*" "$OUT/ctest.log" | tee -a "$log"
  tests_line="tests: $(grep -E 'tests passed' "$OUT/ctest.log" | tail -1)"
  tests_line+="; skipped $(grep -c '\*\*\*Skipped' "$OUT/ctest.log")"
  if [ $rc -ne 0 ]; then
    status=1
    say "FAIL: tests (rc $rc; log: ctest.log)"
  fi
fi

# ---- backend-equivalence sweep ---------------------------------------------------------------
# Every operation of the forward pass on CUDA (and on the CPU, for comparison) x every qtype x
# odd shapes, against a float64 reference (tests/backend_ops_test.cpp); the table is the largest
# |error| / bound per operation and qtype (a value above 1 fails).
ops_table="$OUT/backend_ops_table.txt"
if [ "$run_tests" = 1 ]; then
  say "backend ops sweep ($(elapsed))"
  timeout $((60 * scale)) "$build/tests/qforge_cuda_tests" "[backend_ops]" >"$ops_table" 2>&1
  rc=$?
  tee -a "$log" <"$ops_table"
  if [ $rc -ne 0 ]; then
    status=1
    say "FAIL: backend ops sweep (rc $rc; table: backend_ops_table.txt)"
  fi
fi

# ---- benchmark -------------------------------------------------------------------------------
table="$OUT/gpu_check_table.txt"
if [ "$run_bench" = 1 ]; then
  say "benchmark ($(elapsed))"
  bench_args=(--out "$table")
  [ "$quick" = 1 ] && bench_args+=(--quick)
  timeout $((120 * scale)) "$build/bench/qforge_cuda_bench" "${bench_args[@]}" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    status=1
    say "FAIL: benchmark (rc $rc)"
  fi
fi

# ---- summary ---------------------------------------------------------------------------------
{
  echo
  echo "== gpu_check summary ($(elapsed))"
  echo "$tests_line"
  [ -s "$ops_table" ] && grep -E "^(backend|cuda)" "$ops_table"
  [ -s "$table" ] && cat "$table"
  [ "$status" = 0 ] && echo "gpu_check: OK" || echo "gpu_check: FAILED (see above)"
} 2>&1 | tee -a "$log"
if [ -s "$table" ]; then
  printf '\n%s\n' "$tests_line" >>"$table"
fi
exit "$status"
