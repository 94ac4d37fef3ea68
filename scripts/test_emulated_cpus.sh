#!/usr/bin/env bash
# Runs the tests on CPUs this machine is not, under QEMU's user-mode emulator (Debian's
# qemu-user): `-cpu max` has AVX2, FMA and F16C but no AVX-512 (an AVX2-only machine, as the
# Zen 3 ones of this project's kind are) and `-cpu Nehalem` has no AVX at all. For each it checks
# that `qforge --version` reports the level such a machine dispatches (avx2, scalar), then runs
# the test binary there, with every qforge the tests start through run_qforge under the same
# emulated CPU (QFORGE_TEST_RUNNER, tests/cli_support.hpp; a few children that compare no levels,
# the kill and script tests', run natively). CUDA sees no device there (CUDA_VISIBLE_DEVICES is
# emptied), and the level variables (QFORGE_ISA, QFORGE_NO_AVX2) are cleared. What this finds:
# the run-time dispatch on a CPU without AVX-512, and any instruction above a level's own leaking
# into it. QEMU 7.2 emulates neither AVX-512 nor AVX-VNNI, and its speed says nothing about a
# real CPU's: correctness only. On a host that is not x86-64 it prints SKIPPED.
#
# Usage: scripts/test_emulated_cpus.sh [BUILD_DIR] [TEST_SPEC...]
#   BUILD_DIR  a build with cli/qforge and tests/qforge_tests (default: build)
#   TEST_SPEC  a Catch2 test spec (names, [tags]; a comma between them is "or"; default: every
#              test); one that matches nothing fails
# Exit status: 0 when every check passed (or qemu-x86_64 is absent: SKIPPED is printed), 1 when
# one failed, 2 on a usage error.
set -euo pipefail
cd "$(dirname "$0")/.."

build=${1:-build}
[ $# -gt 0 ] && shift
qforge="$build/cli/qforge"
tests="$build/tests/qforge_tests"
for f in "$qforge" "$tests"; do
  [ -x "$f" ] || { echo "test_emulated_cpus: $f: no such executable (build first)" >&2; exit 2; }
done
if [ "$(uname -m)" != x86_64 ]; then
  echo "SKIPPED: emulated CPUs: this host is $(uname -m), not x86-64"
  exit 0
fi
if ! command -v qemu-x86_64 >/dev/null 2>&1; then
  echo "SKIPPED: emulated CPUs: qemu-x86_64 is absent (apt-get install qemu-user)"
  exit 0
fi
unset QFORGE_ISA QFORGE_NO_AVX2 QFORGE_NO_AVX_VNNI
export CUDA_VISIBLE_DEVICES=""

# A host without AVX-512 and without AVX-VNNI (a Zen 3) dispatches the avx2 level natively, with
# the maddubs kernels `-cpu max` would run: the native test run has already tested that level on
# real hardware, and an instruction above it would have stopped that run with SIGILL. There the
# emulated avx2 run (75 s on such a host) is skipped, saying so.
host_above_avx2=0
grep -qwE 'avx512f|avx_vnni' /proc/cpuinfo 2>/dev/null && host_above_avx2=1

status=0
for cpu_level in "max avx2" "Nehalem scalar"; do
  read -r cpu level <<<"$cpu_level"
  if [ "$level" = avx2 ] && [ $host_above_avx2 = 0 ]; then
    echo "SKIPPED: emulated CPU $cpu (avx2): this host has neither AVX-512 nor AVX-VNNI, so its" \
         "native run tested the avx2 level"
    continue
  fi
  runner="qemu-x86_64 -cpu $cpu"
  reported=$($runner "$qforge" --version | sed -n 's/^CPU kernels: \([a-z0-9_]*\).*/\1/p') ||
    reported="(qforge --version failed)"
  if [ "$reported" != "$level" ]; then
    echo "FAILED: emulated CPU $cpu: qforge --version reports '$reported', expected '$level'" >&2
    status=1
    continue
  fi
  echo "== emulated CPU $cpu: qforge dispatches $level; running the tests there"
  start=$SECONDS
  if QFORGE_TEST_RUNNER="$runner" $runner "$tests" --warn NoTests "$@"; then
    echo "== emulated CPU $cpu ($level): passed in $((SECONDS - start)) s"
  else
    echo "FAILED: emulated CPU $cpu ($level): the tests above" >&2
    status=1
  fi
done
exit $status
