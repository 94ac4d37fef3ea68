#!/usr/bin/env bash
# Runtime speed on the two reference models, with 1 and 2 threads: prefill and decode tokens/s
# (`qforge bench`), and decode's effective read bandwidth (tokens/s x weight bytes per token) as a
# fraction of the machine's read bandwidth measured by qforge_bandwidth with the same thread
# count. Prints one table; run it on a quiet machine (the load average is printed beside it).
#
#   usage: scripts/bench_runtime.sh
#   env:   BUILD_DIR (default build), BENCH_ARGS (default "-p 128 -n 64 -r 5"),
#          THREADS (default "1 2"), BANDWIDTH_MIB (default 1024)
#
# Models, made once and kept in models/ (git-ignored):
#   stories260K.qf          from ../shared/data/stories260K/hf (f32, tied head); reconverted each run
#   synthetic-tinyllama.qf  TinyLlama-1.1B shape, all 22 layers, random f16 weights (2.2 GB),
#                           from scripts/make_synthetic_checkpoint.py --shape tinyllama
set -euo pipefail
cd "$(dirname "$0")/.."

build=${BUILD_DIR:-build}
bench_args=${BENCH_ARGS:-"-p 128 -n 64 -r 5"}
threads=${THREADS:-"1 2"}
data=../shared/data

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target qforge qforge_bandwidth >/dev/null
qforge=$build/cli/qforge
bandwidth=$build/bench/qforge_bandwidth
mkdir -p models

# The synthetic checkpoint is complete when its index (written last) exists and it has all 22
# layers (`--layers 10` writes the same folder for the conversion-memory measurement).
tl_dir=models/synthetic-tinyllama
tl_layers=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["num_hidden_layers"])' \
  "$tl_dir/config.json" 2>/dev/null || echo 0)
if [ ! -f "$tl_dir/model.safetensors.index.json" ] || [ "$tl_layers" != 22 ]; then
  rm -f models/synthetic-tinyllama.qf
  python3 scripts/make_synthetic_checkpoint.py "$tl_dir" --shape tinyllama
fi
tl_qf=models/synthetic-tinyllama.qf
if [ ! -f "$tl_qf" ] || [ "$tl_dir/model.safetensors.index.json" -nt "$tl_qf" ]; then
  $qforge convert "$tl_dir" -o "$tl_qf" -q >&2
fi
models=()
if [ -d "$data/stories260K/hf" ]; then
  $qforge convert "$data/stories260K/hf" -o models/stories260K.qf >&2 \
    --tokenizer "$data/stories260K/tok512.bin" -q
  models+=(models/stories260K.qf)
else
  echo "bench_runtime: $data/stories260K is absent; measuring the TinyLlama shape only" >&2
fi
models+=("$tl_qf")

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
max_threads=$(echo "$threads" | tr ' ' '\n' | sort -n | tail -1)
$bandwidth --mib "${BANDWIDTH_MIB:-1024}" --threads "$max_threads" --json >"$out/bandwidth.json"
for t in $threads; do
  bw=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["results"]
print(next(x["gb_per_s"] for x in r if x["threads"]==int(sys.argv[2])))' "$out/bandwidth.json" "$t")
  for m in "${models[@]}"; do
    echo "bench_runtime: $m, $t thread(s)" >&2
    # shellcheck disable=SC2086
    $qforge bench "$m" $bench_args -t "$t" --bandwidth "$bw" --json -q >"$out/$(basename "$m" .qf)-$t.json"
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$out" "$load_before" "$load_after" "$bench_args" <<'EOF'
import glob, json, os, sys
out, before, after, args = sys.argv[1:]
rows = [json.load(open(p)) for p in glob.glob(os.path.join(out, "*-*.json"))]
rows.sort(key=lambda j: (j["weight_bytes_per_token"], j["threads"]))
print(f"qforge bench {args}; medians; load average {before} before, {after} after")
print(f"| model | threads | prefill tok/s | decode tok/s | weight MB/token | GB/s effective | read GB/s | fraction |")
print(f"|---|---|---|---|---|---|---|---|")
for j in rows:
    print(f"| {os.path.basename(j['model'])} | {j['threads']} | {j['prefill_tok_per_s']['median']:.1f} "
          f"| {j['decode_tok_per_s']['median']:.2f} | {j['weight_bytes_per_token'] / 1e6:.3f} "
          f"| {j['effective_gb_per_s']:.2f} | {j['read_bandwidth_gb_s']:.1f} "
          f"| {100 * j['bandwidth_fraction']:.1f}% |")
if any(j["bandwidth_fraction"] > 1 for j in rows):
    print("(above 100%: decode read faster than qforge_bandwidth's sum did; expected where the weights\n"
          " fit in the CPU caches, as stories260K's 1 MB does; near 100% it is the noise of both figures)")
EOF
