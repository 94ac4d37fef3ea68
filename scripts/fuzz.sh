#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/, CMake option QFORGE_FUZZ, in build-fuzz) and runs each
# for SECONDS (default 20) on a copy of its seed corpus, after replaying its committed
# regression inputs. Fails on any crash, leak, timeout or out-of-memory and prints the input
# that reproduces it. One summary line per harness.
#
#   scripts/fuzz.sh [SECONDS] [HARNESS...]   harness names as in fuzz/: gguf, qf, zstd, ...
#   scripts/fuzz.sh --probe                  exit 0 when clang and libFuzzer are usable, else
#                                            print the reason and exit 1 (scripts/test.sh)
#
# Environment: FUZZ_BUILD (build dir, default build-fuzz), FUZZ_JOBS (harnesses run at once,
# default 1), FUZZ_FRESH=1 (start from the seeds, dropping the corpus earlier runs grew),
# FUZZ_OPT (optimization level, default -O1), FUZZ_DEBUG=0 (no -g: reports name functions but not
# lines), FUZZ_CONFIGURED=1 (FUZZ_BUILD is a build already configured with QFORGE_FUZZ, as
# scripts/test.sh's sanitizer build: use it as it is).
set -euo pipefail
cd "$(dirname "$0")/.."

all=(safetensors config_json tokenizer_json gguf qf zstd llama2c llama2c_vocab hf_import calibration
     openai_request json_schema regex)
build=${FUZZ_BUILD:-build-fuzz}
cxx=${FUZZ_CXX:-clang++}

probe() {
  command -v "$cxx" >/dev/null 2>&1 || { echo "no $cxx (Debian: apt-get install clang)"; return 1; }
  local dir
  dir=$(mktemp -d)
  printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' \
    >"$dir/p.cpp"
  if ! "$cxx" -fsanitize=fuzzer,address,undefined "$dir/p.cpp" -o "$dir/p" >"$dir/log" 2>&1; then
    echo "$cxx cannot link -fsanitize=fuzzer (Debian: apt-get install libclang-rt-dev," \
         "libclang-rt-14-dev on bookworm): $(head -c 300 "$dir/log")"
    rm -rf "$dir"
    return 1
  fi
  rm -rf "$dir"
}

if [ "${1:-}" = "--probe" ]; then
  probe
  exit $?
fi

seconds=20
if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then
  seconds=$1
  shift
fi
harnesses=("$@")
[ ${#harnesses[@]} -eq 0 ] && harnesses=("${all[@]}")
for h in "${harnesses[@]}"; do
  [ -f "fuzz/fuzz_$h.cpp" ] || { echo "fuzz: no harness '$h' (have: ${all[*]})" >&2; exit 2; }
done

if ! reason=$(probe); then
  echo "fuzz: $reason" >&2
  exit 1
fi

launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# -O1 -g: stacks with lines, and the usual level for fuzzing. The CI's 5 s smoke runs the
# harnesses of its sanitizer build, at -O0 without -g (FUZZ_CONFIGURED): with the sanitizers, -O1
# compiles about 40% more slowly and -g about 25% (formats/json_io.cpp 15.9 s against 12.5,
# clang 14), and a smoke needs the harnesses built and run, not speed; a failure it finds is rerun
# here with lines.
debug=" -g"
[ "${FUZZ_DEBUG:-1}" = 0 ] && debug=""
# A unity build (8 files to a unit, CMAKE_UNITY_BUILD), as CI's sanitizer build: the fuzzed code
# is the same.
if [ "${FUZZ_CONFIGURED:-0}" != 1 ]; then
  cmake -S . -B "$build" -DQFORGE_FUZZ=ON -DCMAKE_CXX_COMPILER="$cxx" -DQFORGE_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="${FUZZ_OPT:--O1}$debug" \
    -DQFORGE_WERROR=ON -DCMAKE_UNITY_BUILD=ON "${launcher[@]}" >/dev/null
fi
targets=()
for h in "${harnesses[@]}"; do targets+=(--target "fuzz_$h"); done
cmake --build "$build" -j"$(nproc)" "${targets[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Per input: 10 s; memory: 2 GiB resident, and any single allocation over 1 GiB is reported as
# an out-of-memory crash (no input here is larger than a few hundred KB, so nothing legitimate
# allocates that much: such an allocation is a declared size the reader did not bound).
limits=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024)

# Runs one harness; writes its summary line to $work/summary and returns non-zero on failure.
run_one() {
  local h=$1 bin="$build/fuzz/fuzz_$h" work="$build/fuzz-work/$1"
  mkdir -p "$work/corpus" "$work/artifacts"
  [ "${FUZZ_FRESH:-0}" = 1 ] && rm -rf "${work:?}/corpus" && mkdir -p "$work/corpus"
  rm -f "$work"/artifacts/*
  cp -r "fuzz/corpus/$h/." "$work/corpus/"
  local dict=()
  [ -f "fuzz/$h.dict" ] && dict=(-dict="fuzz/$h.dict")

  # The committed regressions first: each must now pass.
  if [ -d "fuzz/regressions/$h" ] && [ -n "$(ls -A "fuzz/regressions/$h")" ]; then
    if ! "$bin" "${limits[@]}" "fuzz/regressions/$h"/* >"$work/regressions.log" 2>&1; then
      echo "fuzz $h: FAILED: a committed regression input fails again (log: $work/regressions.log)" \
        | tee "$work/summary"
      grep -m1 -E "Running: |==ERROR|runtime error|qforge-fuzz" "$work/regressions.log" || true
      return 1
    fi
  fi

  local rc=0
  "$bin" "${limits[@]}" "${dict[@]}" -max_total_time="$seconds" -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" "$work/corpus" >"$work/fuzz.log" 2>&1 || rc=$?
  local execs rate rss cov ft units result
  execs=$(grep -oP 'stat::number_of_executed_units:\s*\K[0-9]+' "$work/fuzz.log" | tail -1 || true)
  rate=$(grep -oP 'stat::average_exec_per_sec:\s*\K[0-9]+' "$work/fuzz.log" | tail -1 || true)
  rss=$(grep -oP 'stat::peak_rss_mb:\s*\K[0-9]+' "$work/fuzz.log" | tail -1 || true)
  cov=$(grep -oP '^#[0-9]+.*\bcov: \K[0-9]+' "$work/fuzz.log" | tail -1 || true)
  ft=$(grep -oP '^#[0-9]+.*\bft: \K[0-9]+' "$work/fuzz.log" | tail -1 || true)
  units=$(find "$work/corpus" -type f | wc -l)
  local artifact
  artifact=$(grep -oP 'Test unit written to \K\S+' "$work/fuzz.log" | tail -1 || true)
  if [ $rc -eq 0 ] && [ -z "$artifact" ]; then
    result=OK
  else
    local kind
    kind=$(grep -m1 -oE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer): [a-z-]+|runtime error:.*|==qforge-fuzz==.*|out-of-memory|timeout' \
      "$work/fuzz.log" | head -c 200 || true)
    result="FAILED (exit $rc) ${kind:-see log}: reproduce with $bin ${artifact:-<none written>} (log: $work/fuzz.log)"
  fi
  printf 'fuzz %-15s %10s execs  %6s s  %6s exec/s  cov %5s  ft %6s  corpus %5s  rss %4s MB  %s\n' \
    "$h" "${execs:-?}" "$seconds" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$units" "${rss:-?}" "$result" \
    | tee "$work/summary"
  [ "$result" = OK ]
}

jobs=${FUZZ_JOBS:-1}
failed=0
pids=()
for h in "${harnesses[@]}"; do
  run_one "$h" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
if [ $failed -ne 0 ]; then
  echo "fuzz: FAILED (the reproducers are listed above; fuzz/README.md: adding a regression)" >&2
  exit 1
fi
echo "fuzz: all ${#harnesses[@]} harnesses OK (${seconds} s each)"
