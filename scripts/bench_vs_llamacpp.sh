#!/usr/bin/env bash
# qforge side by side with llama.cpp on the same machine, in one run, with alternating
# repetitions (qforge, llama.cpp, qforge, ...) and medians: pp128 and tg64 (`qforge bench` against
# `llama-bench`) and perplexity throughput (`qforge ppl` against `llama-perplexity`, ctx 512, the
# same text, the same weights). Prints one table with both tok/s, their ratio and the load average
# during the runs (the machine is shared: read ratios of alternating runs, not absolute figures).
#
#   usage: scripts/bench_vs_llamacpp.sh LLAMA_BUILD_DIR [PAIR...]
#     LLAMA_BUILD_DIR  an existing llama.cpp CMake build directory with bin/llama-bench,
#                      bin/llama-perplexity and bin/llama-quantize (this script never builds it)
#     PAIR             NAME=QF,GGUF[,ppl]: qforge's QF against llama.cpp's GGUF (",ppl" also
#                      measures perplexity throughput). Default: the pairs below, made in
#                      models/bench/ when absent.
#   env: REPS (5), THREADS (2), PP (128), TG (64), PPL_CHUNKS (4), PPL_CTX (512),
#        TEXT (../shared/data/wikitext-2-raw/wiki.test.raw), BUILD_DIR (qforge's, default build),
#        OUT_DIR (raw results kept there), BANDWIDTH (GB/s; default: measured by each qforge run),
#        LLAMA_ENV (default OMP_WAIT_POLICY=passive; "" for llama.cpp's default)
#
# LLAMA_ENV: llama.cpp's OpenMP threads spin between graphs by default; on a host whose two cores
# other processes share, that made its 2-thread runs up to 100x slower than 1 thread (SmolLM2-135M
# pp32 2.3 tok/s against 476), while passive waiting gave 631. The default therefore measures
# llama.cpp with passive waiting; on a quiet machine the two should agree.
# Default pairs. Identical weights in both tools: llama-quantize --allow-requantize --pure makes
# F16, Q8_0 and Q4_0 GGUFs; `qforge convert --dtype f16` reads the F16 one, `convert --keep-quant`
# keeps Q8_0 blocks as q8_g32 and Q4_0 as q4s_g32 bit for bit. qforge's own q8 (per-channel)
# against Q8_0; its own q4_g32 and q4_g128 (`qforge quantize` of the f16 .qf, default recipe: the
# output head, or a tied embedding that serves as one, at q8_g32) against llama-quantize's default
# Q4_0 recipe (no --pure: its head Q6_K, or Q8_0 where rows are not whole 256-blocks, as for
# SmolLM2's tied embedding), so both tools' 4-bit files read a head of at least 6 bits.
#   smol-*  SmolLM2-135M-Instruct (scripts/get_models.sh smollm2): its Q4_1 GGUF requantized
#   tl-*    the TinyLlama-1.1B shape with random weights: needs models/bench/tl-F16.gguf, an F16
#           GGUF of scripts/get_models.sh synthetic's models/synthetic-tinyllama (`qforge export
#           --format gguf` of its f16 .qf, or any HF-to-GGUF converter; without it these pairs
#           are skipped with a message)
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '8,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] || { echo "bench_vs_llamacpp: no llama.cpp build directory given" >&2; usage; }
llama=$1
shift
for tool in llama-bench llama-perplexity llama-quantize; do
  if [ ! -x "$llama/bin/$tool" ]; then
    echo "bench_vs_llamacpp: $llama/bin/$tool is missing or not executable: pass an existing llama.cpp" \
      "build directory (cmake --build DIR --target llama-bench llama-perplexity llama-quantize)" >&2
    usage
  fi
done

reps=${REPS:-5}
threads=${THREADS:-2}
pp=${PP:-128}
tg=${TG:-64}
ppl_chunks=${PPL_CHUNKS:-4}
ppl_ctx=${PPL_CTX:-512}
llama_env=${LLAMA_ENV-OMP_WAIT_POLICY=passive}
text=${TEXT:-../shared/data/wikitext-2-raw/wiki.test.raw}
qforge=${BUILD_DIR:-build}/cli/qforge
[ -x "$qforge" ] || { echo "bench_vs_llamacpp: $qforge is missing: build qforge first" >&2; exit 2; }
log() { echo "bench_vs_llamacpp: $*" >&2; }

# Makes models/bench/PREFIX-{F16,Q8_0,Q4_0}.gguf from SOURCE_GGUF and the qforge files from them;
# prints the default pairs. What exists is kept.
bench=models/bench
make_family() {
  local prefix=$1 src=$2 ppl=$3 t
  mkdir -p "$bench"
  for t in F16 Q8_0 Q4_0; do
    [ -f "$bench/$prefix-$t.gguf" ] || [ "$src" = "$bench/$prefix-$t.gguf" ] ||
      "$llama/bin/llama-quantize" --allow-requantize --pure "$src" "$bench/$prefix-$t.gguf" "$t" 2 >/dev/null 2>&1 ||
      { log "llama-quantize $src -> $t failed"; return 1; }
  done
  [ -f "$bench/$prefix-Q4_0-default.gguf" ] ||
    "$llama/bin/llama-quantize" --allow-requantize "$src" "$bench/$prefix-Q4_0-default.gguf" Q4_0 2 >/dev/null 2>&1 ||
    { log "llama-quantize $src -> Q4_0 (default recipe) failed"; return 1; }
  [ -f "$bench/$prefix-f16.qf" ] || $qforge -q convert "$bench/$prefix-F16.gguf" --dtype f16 -o "$bench/$prefix-f16.qf" >&2
  [ -f "$bench/$prefix-q8_g32.qf" ] || $qforge -q convert "$bench/$prefix-Q8_0.gguf" --keep-quant -o "$bench/$prefix-q8_g32.qf" >&2
  [ -f "$bench/$prefix-q4s_g32.qf" ] || $qforge -q convert "$bench/$prefix-Q4_0.gguf" --keep-quant -o "$bench/$prefix-q4s_g32.qf" >&2
  for t in q8 q4_g32 q4_g128; do
    [ -f "$bench/$prefix-$t.qf" ] || $qforge -q quantize "$bench/$prefix-f16.qf" --qtype "$t" -t "$threads" \
      -o "$bench/$prefix-$t.qf" >/dev/null 2>&1
  done
  echo "$prefix-f16=$bench/$prefix-f16.qf,$bench/$prefix-F16.gguf$ppl"
  echo "$prefix-q8_g32=$bench/$prefix-q8_g32.qf,$bench/$prefix-Q8_0.gguf$ppl"
  echo "$prefix-q4s_g32=$bench/$prefix-q4s_g32.qf,$bench/$prefix-Q4_0.gguf"
  echo "$prefix-q8=$bench/$prefix-q8.qf,$bench/$prefix-Q8_0.gguf"
  echo "$prefix-q4_g32=$bench/$prefix-q4_g32.qf,$bench/$prefix-Q4_0-default.gguf"
  echo "$prefix-q4_g128=$bench/$prefix-q4_g128.qf,$bench/$prefix-Q4_0-default.gguf"
}

pairs=("$@")
if [ ${#pairs[@]} -eq 0 ]; then
  smol_src=models/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ -f "$smol_src" ]; then
    mapfile -t -O "${#pairs[@]}" pairs < <(make_family smol "$smol_src" ,ppl)
  else
    log "$smol_src is absent (scripts/get_models.sh smollm2): skipping SmolLM2-135M"
  fi
  if [ -f "$bench/tl-F16.gguf" ]; then
    mapfile -t -O "${#pairs[@]}" pairs < <(make_family tl "$bench/tl-F16.gguf" "")
  else
    log "$bench/tl-F16.gguf is absent: skipping the TinyLlama-1.1B shape (see the header)"
  fi
  [ ${#pairs[@]} -gt 0 ] || { log "no models to measure"; exit 1; }
fi

# The distinct models of each tool, each measured once per repetition even when several pairs
# share it (the default-recipe Q4_0 GGUF serves two qforge types).
declare -A qf_seen=() gg_seen=() ppl_q=() ppl_g=()
qfs=() ggs=()
for p in "${pairs[@]}"; do
  spec=${p#*=}
  IFS=, read -r qf gg opt <<<"$spec"
  if [ ! -f "$qf" ] || [ ! -f "$gg" ]; then log "$p: $qf or $gg is missing"; exit 1; fi
  [ -n "${qf_seen[$qf]:-}" ] || { qf_seen[$qf]=1; qfs+=("$qf"); }
  [ -n "${gg_seen[$gg]:-}" ] || { gg_seen[$gg]=1; ggs+=("$gg"); }
  if [ "${opt:-}" = ppl ]; then ppl_q[$qf]=1; ppl_g[$gg]=1; fi
done
if [ ${#ppl_q[@]} -gt 0 ] && [ ! -f "$text" ]; then
  log "$text is absent: no perplexity pairs"
  ppl_q=() ppl_g=()
fi

# OUT_DIR keeps the raw results (each run's JSON or log) for a later look; default: a temporary one.
if [ -n "${OUT_DIR:-}" ]; then
  out=$OUT_DIR
  mkdir -p "$out"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
key() { echo "$1" | tr '/' '_'; }
load1() { cut -d' ' -f1 /proc/loadavg; }

# Read bandwidth: given (BANDWIDTH, GB/s), or measured by each qforge run right after its decode
# (`qforge bench` without --bandwidth), so each run's fraction is against its own moment's figure.
bw_args=()
if [ -n "${BANDWIDTH:-}" ]; then
  python3 -c 'import sys; assert float(sys.argv[1]) > 0' "$BANDWIDTH" 2>/dev/null ||
    { echo "bench_vs_llamacpp: BANDWIDTH=$BANDWIDTH is not a positive number of GB/s" >&2; exit 2; }
  bw_args=(--bandwidth "$BANDWIDTH")
fi
log "read bandwidth ${BANDWIDTH:-measured beside each qforge run}; $reps repetitions of ${#qfs[@]} qforge and ${#ggs[@]} llama.cpp models"

run_q() {  # qforge bench / ppl of model $1, repetition $2
  local k
  k=$(key "$1")
  load1 >"$out/q-$k-$2.load"
  $qforge -q bench "$1" -p "$pp" -n "$tg" -r 1 -t "$threads" ${bw_args[@]+"${bw_args[@]}"} --json >"$out/q-$k-$2.json"
  if [ -n "${ppl_q[$1]:-}" ]; then
    $qforge -q ppl "$1" -f "$text" --ctx "$ppl_ctx" --chunks "$ppl_chunks" -t "$threads" --json >"$out/qp-$k-$2.json"
  fi
}
run_g() {  # llama-bench / llama-perplexity of model $1, repetition $2
  local k
  k=$(key "$1")
  load1 >"$out/g-$k-$2.load"
  # shellcheck disable=SC2086
  env $llama_env "$llama/bin/llama-bench" -m "$1" -p "$pp" -n "$tg" -t "$threads" -r 1 -o json >"$out/g-$k-$2.json" 2>/dev/null
  if [ -n "${ppl_g[$1]:-}" ]; then
    # shellcheck disable=SC2086
    env $llama_env "$llama/bin/llama-perplexity" -m "$1" -f "$text" -c "$ppl_ctx" --chunks "$ppl_chunks" -t "$threads" \
      >"$out/gp-$k-$2.txt" 2>&1
  fi
}

start=$SECONDS
for ((r = 1; r <= reps; r++)); do
  n=$(( ${#qfs[@]} > ${#ggs[@]} ? ${#qfs[@]} : ${#ggs[@]} ))
  for ((i = 0; i < n; i++)); do
    [ $i -lt ${#qfs[@]} ] && run_q "${qfs[$i]}" "$r"
    [ $i -lt ${#ggs[@]} ] && run_g "${ggs[$i]}" "$r"
  done
  log "repetition $r of $reps done ($((SECONDS - start)) s)"
done

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')
isa=$($qforge --version | sed -n 's/^CPU kernels: //p')
python3 - "$out" "$reps" "$threads" "$pp" "$tg" "$ppl_ctx" "$ppl_chunks" "$cpu" "$isa" "${BANDWIDTH:-}" "$llama_env" "${pairs[@]}" <<'EOF'
import glob, json, os, re, statistics, sys
out, reps, threads, pp, tg, ctx, chunks, cpu, isa, bw, llama_env = sys.argv[1:12]
pairs = sys.argv[12:]
reps, pp, tg = int(reps), int(pp), int(tg)
key = lambda p: p.replace("/", "_")
med = lambda xs: statistics.median(xs) if xs else float("nan")

def loads(prefix, m):
    return [float(open(f).read()) for f in glob.glob(f"{out}/{prefix}-{key(m)}-*.load")]

def qf_runs(m):
    js = [json.load(open(f)) for f in glob.glob(f"{out}/q-{key(m)}-*.json")]
    return ([j["prefill_tok_per_s"]["median"] for j in js], [j["decode_tok_per_s"]["median"] for j in js],
            [j["bandwidth_fraction"] for j in js])

def gg_runs(m):
    pps, tgs = [], []
    for f in glob.glob(f"{out}/g-{key(m)}-*.json"):
        for t in json.load(open(f)):
            if t["n_prompt"] == pp and t["n_gen"] == 0: pps.append(t["avg_ts"])
            if t["n_gen"] == tg and t["n_prompt"] == 0: tgs.append(t["avg_ts"])
    return pps, tgs

def qf_ppl(m):
    js = [json.load(open(f)) for f in glob.glob(f"{out}/qp-{key(m)}-*.json")]
    return [j["tokens_per_second"] for j in js], [j["ppl"] for j in js]

def gg_ppl(m):
    tps, ppls = [], []
    for f in glob.glob(f"{out}/gp-{key(m)}-*.txt"):
        s = open(f, errors="replace").read()
        t = re.search(r"prompt eval time =\s*[\d.]+ ms /\s*\d+ tokens \(\s*[\d.]+ ms per token,\s*([\d.]+) tokens per second", s)
        p = re.search(r"Final estimate: PPL = ([\d.]+)", s)
        if t: tps.append(float(t.group(1)))
        if p: ppls.append(float(p.group(1)))
    return tps, ppls

def cell(a, b):
    return f"{med(a):.1f} vs {med(b):.1f} | {med(a) / med(b):.2f}x" if a and b else "- | -"

bws = [json.load(open(f))["read_bandwidth_gb_s"] for p in pairs
       for f in glob.glob(f"{out}/q-{key(p.split('=', 1)[1].split(',')[0])}-*.json")]
bw_text = (f"{float(bw):.1f} GB/s (given)" if bw else
           f"{med(bws):.1f} GB/s median ({min(bws):.1f}-{max(bws):.1f}), measured beside each qforge decode run; "
           "each run's tg is quoted against its own")
print(f"CPU: {cpu}; qforge CPU kernels: {isa}; {threads} threads; read bandwidth {bw_text}")
print(f"llama.cpp run with environment: {llama_env or '(none)'}")
print(f"medians of {reps} alternating runs; the host is shared with other agents building (load = 1-min load average, min-max over the pair's runs)")
print()
print(f"| qforge vs llama.cpp | pp{pp} tok/s | ratio | tg{tg} tok/s | ratio | qforge tg of read BW | ppl ctx {ctx} x {chunks} chunks tok/s | ratio | PPL qforge / llama.cpp | load |")
print("|---|---|---|---|---|---|---|---|---|---|")
for p in pairs:
    name, spec = p.split("=", 1)
    parts = spec.split(",")
    q, g = parts[0], parts[1]
    qpp, qtg, qfrac = qf_runs(q)
    gpp, gtg = gg_runs(g)
    qt, qp = qf_ppl(q)
    gt, gp = gg_ppl(g)
    ls = loads("q", q) + loads("g", g)
    gname = os.path.basename(g).rsplit(".", 1)[0]
    ppl_cells = f"{cell(qt, gt)} | {med(qp):.3f} / {med(gp):.3f}" if qt and gt else "- | - | -"
    print(f"| {name} vs {gname} | {cell(qpp, gpp)} | {cell(qtg, gtg)} | {100 * med(qfrac):.0f}% | {ppl_cells} "
          f"| {min(ls):.1f}-{max(ls):.1f} |")
EOF
log "done in $((SECONDS - start)) s"
