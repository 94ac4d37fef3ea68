#!/usr/bin/env bash
# Prepares what scripts/gpu_check.sh carries to a lent GPU machine, which has nvcc, CMake and ninja
# but no Debian -dev packages and no network. Run it here (Debian 12 with apt, after a normal build
# of qforge); it is idempotent and writes only git-ignored folders:
#
#   third_party/debs/        the .deb files of the header-only and static dependencies of the
#                            CUDA-only build, fetched with `apt-get download` (no install), and
#   third_party/debs/root/   their contents unpacked with `dpkg -x` (QFORGE_DEPS_ROOT):
#                              nlohmann-json3-dev  JSON (formats)
#                              catch2              the test framework (header + CMake files)
#                              libzstd-dev         zstd (formats), as its static library
#                              libxxhash-dev       xxhash (core, formats), as its static library
#                            (CLI11, ICU and Oniguruma are not needed: the GPU check builds no CLI
#                            and no tokenizer.)
#   third_party/gpu_check_data/   stories260K as .qf files for the CUDA tests (QFORGE_GPU_CHECK_DATA):
#                            stories260K.qf (f32), -f16, -q8, -q4_g32, made by this checkout's qforge
#                            from ../shared/data/stories260K (or $QFORGE_SHARED_DATA/stories260K).
#
# Usage: scripts/fetch_gpu_check_deps.sh [--qforge PATH/TO/qforge]   (default: the first of
#        build/cli/qforge, build-*/cli/qforge that exists)
set -euo pipefail
cd "$(dirname "$0")/.."

qforge=""
while [ $# -gt 0 ]; do
  case "$1" in
    --qforge) qforge="${2:?--qforge needs a path}"; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "fetch_gpu_check_deps: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

debs=third_party/debs
packages=(nlohmann-json3-dev catch2 libzstd-dev libxxhash-dev)
mkdir -p "$debs"
for p in "${packages[@]}"; do
  if ! ls "$debs/${p}"_*.deb >/dev/null 2>&1; then
    echo "fetch_gpu_check_deps: apt-get download $p" >&2
    (cd "$debs" && apt-get download "$p" 2>&1 | grep -v "unsandboxed" >&2 || true)
    ls "$debs/${p}"_*.deb >/dev/null 2>&1 || { echo "fetch_gpu_check_deps: could not download $p" >&2; exit 1; }
  fi
done
rm -rf "$debs/root"
for f in "$debs"/*.deb; do dpkg -x "$f" "$debs/root"; done
rm -rf "$debs/root/usr/share/doc"
echo "fetch_gpu_check_deps: unpacked ${#packages[@]} packages into $debs/root ($(du -sh "$debs/root" | cut -f1))" >&2

if [ -z "$qforge" ]; then
  for c in build/cli/qforge build-*/cli/qforge; do
    if [ -x "$c" ]; then qforge=$c; break; fi
  done
fi
[ -x "$qforge" ] || { echo "fetch_gpu_check_deps: no qforge binary found; build one or pass --qforge" >&2; exit 1; }
shared=${QFORGE_SHARED_DATA:-../shared/data}
src="$shared/stories260K"
[ -d "$src/hf" ] || { echo "fetch_gpu_check_deps: $src/hf is absent (set QFORGE_SHARED_DATA)" >&2; exit 1; }
data=third_party/gpu_check_data
mkdir -p "$data"
"$qforge" -q convert "$src/hf" --tokenizer "$src/tok512.bin" -o "$data/stories260K.qf" >/dev/null
"$qforge" -q convert "$src/hf-fp16" --tokenizer "$src/tok512.bin" -o "$data/stories260K-f16.qf" >/dev/null
for q in q8 q4_g32; do
  "$qforge" -q quantize "$data/stories260K.qf" --qtype "$q" -o "$data/stories260K-$q.qf" >/dev/null 2>&1
done
echo "fetch_gpu_check_deps: $data holds $(ls "$data" | tr '\n' ' ')($(du -sh "$data" | cut -f1))" >&2
