# Sourced by the report scripts (quant_report.sh, calib_report.sh) from the repository root:
# reads BUILD_DIR (default build), THREADS (default 2) and CHUNKS (default 200) into $build,
# $threads and $chunks, sets $data (../shared/data), builds qforge in $build (Release; or takes
# $QFORGE_BIN as it is) and sets $qforge, a scratch folder $out removed on exit, and json FILE
# EXPR, which prints a Python expression over the parsed JSON file `j`.
build=${BUILD_DIR:-build}
threads=${THREADS:-2}
chunks=${CHUNKS:-200}
data=../shared/data
# QFORGE_BIN: a qforge binary to run as it is (nothing is built).
if [ -z "${QFORGE_BIN:-}" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j"$(nproc)" --target qforge >/dev/null
fi
qforge=${QFORGE_BIN:-$build/cli/qforge}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

json() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"j": j}))' "$@"; }
