#!/usr/bin/env bash
# Quality against size, every type x method (or a chosen subset), in one CSV and one plot.
#
#   usage: scripts/quality_sweep.sh MODEL TEXT CALIB [TYPE:METHOD ...]
#     MODEL   the float model (.qf or anything quantize reads); KLD and PPL are measured against it
#     TEXT    evaluation text (ppl --protocol llamacpp, ctx $CTX, the first $CHUNKS chunks)
#     CALIB   calibration text ($NSAMPLES windows of $SEQLEN tokens; the methods' other options
#             are quantize's defaults, which are the measured best: README, "Defaults")
#     TYPE:METHOD  bash patterns choosing rows, e.g. 'q4*:gptq' 'q3k_g32:*' (default: all).
#             Types: every quantized type of `qforge quantize --help`; methods: rtn (plain),
#             rtn-calib (importance-weighted RTN), gptq, awq, awq+gptq; gptq-noimp and awq-noimp
#             (the grids without importance, these methods' defaults before it measured better).
#             A type @SIZE (e.g. '@91.0M:gptq', sizes as quantize's --target-size) is the size
#             plan at that file size: --qtype q4 --target-size SIZE with the method (needs the
#             text, so rtn-calib, not rtn); such a pattern adds its type to the list.
#   env:    OUT (the CSV; default quality_sweep.csv; the plot is the same name .png), CTX (512),
#           CHUNKS (40), NSAMPLES (64), SEQLEN (256), THREADS (2), QFORGE_BIN (a qforge binary to
#           run as it is; default: build/cli/qforge, built first), MAX_SECONDS (skip a
#           quantization that would run longer: timeout, the row says so; default none),
#           TYPES, METHODS (the lists the patterns choose from), GNUPLOT (default gnuplot)
#
# Rows already in the CSV are kept and not measured again, so an interrupted sweep continues
# where it stopped (delete the CSV to start over). Columns: type, method, file_bytes, bpw (file
# bits per weight: 8 x file bytes / parameters), ppl, ppl_stderr, kld, top1, quantize_s, status
# (ok, or why the row has no figures). The float model is the row "float" (the base figures of
# the first row's pass). The plot (KLD and PPL
# against file bytes) needs gnuplot; without it the CSV is written and the plot is SKIPPED with a
# message.
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n '3,17p' "$0" >&2
  exit 2
fi
model=$1 text=$2 calib=$3
shift 3
filters=("$@")
[ ${#filters[@]} -eq 0 ] && filters=('*:*')
for f in "$model" "$text" "$calib"; do
  [ -e "$f" ] || { echo "quality_sweep: $f does not exist" >&2; exit 2; }
done
out=${OUT:-quality_sweep.csv}
ctx=${CTX:-512} chunks=${CHUNKS:-40} nsamples=${NSAMPLES:-64} seqlen=${SEQLEN:-256}
threads=${THREADS:-2}
types=${TYPES:-"q8 q8_g32 q8_g128 q4_g32 q4_g64 q4_g128 q4s_g32 q4s_g64 q4s_g128 q4k_g32 q4nl_g32 q4t_g32 q3_g32 q3_g128 q3k_g32"}
methods=${METHODS:-"rtn rtn-calib gptq gptq-noimp awq awq-noimp awq+gptq"}
for f in "${filters[@]}"; do  # size-plan types are named by their patterns
  t=${f%%:*}
  [[ $t == @* && " $types " != *" $t "* ]] && types="$types $t"
done
repo=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${QFORGE_BIN:-}" ]; then
  cmake -S "$repo" -B "$repo/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$repo/build" -j"$(nproc)" --target qforge >/dev/null
fi
qforge=${QFORGE_BIN:-$repo/build/cli/qforge}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

json() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"j": j}))' "$@"; }
have_row() { [ -f "$out" ] && grep -q "^$1,$2," "$out"; }
[ -f "$out" ] || echo "type,method,file_bytes,bpw,ppl,ppl_stderr,kld,top1,quantize_s,status" >"$out"

qtype_args() {  # TYPE -> quantize's type options
  case $1 in
    @*) echo "--qtype q4 --target-size ${1#@}" ;;
    *) echo "--qtype $1" ;;
  esac
}

method_args() {
  case $1 in
    rtn) echo "--method rtn" ;;
    rtn-calib) echo "--method rtn --calib $calib --nsamples $nsamples --seqlen $seqlen" ;;
    gptq | awq | awq+gptq) echo "--method $1 --calib $calib --nsamples $nsamples --seqlen $seqlen" ;;
    gptq-noimp | awq-noimp) echo "--method ${1%-noimp} --no-importance --calib $calib --nsamples $nsamples --seqlen $seqlen" ;;
    *) echo "quality_sweep: unknown method $1 (rtn, rtn-calib, gptq, gptq-noimp, awq, awq-noimp, awq+gptq)" >&2; return 1 ;;
  esac
}

evaluate() {  # MODEL.qf -> $scratch/p.json
  "$qforge" ppl "$1" -f "$text" --protocol llamacpp --ctx "$ctx" --chunks "$chunks" \
    -t "$threads" --kl-base "$model" --json -q >"$scratch/p.json"
}


for t in $types; do
  for m in $methods; do
    chosen=0
    for f in "${filters[@]}"; do
      # shellcheck disable=SC2053
      [[ $t == ${f%%:*} && $m == ${f#*:} ]] && chosen=1
    done
    [ $chosen = 1 ] || continue
    have_row "$t" "$m" && continue
    dst=$scratch/m.qf
    limit=()
    [ -n "${MAX_SECONDS:-}" ] && limit=(timeout "$MAX_SECONDS")
    t0=$(date +%s.%N)
    rc=0
    # shellcheck disable=SC2046
    "${limit[@]}" "$qforge" quantize "$model" -o "$dst" $(qtype_args "$t") $(method_args "$m") \
      -t "$threads" --json >"$scratch/q.json" 2>"$scratch/q.log" || rc=$?
    if [ "$rc" != 0 ]; then
      why=$(tail -n 1 "$scratch/q.log" | tr ',' ';')
      [ "$rc" = 124 ] && why="skipped: quantization over MAX_SECONDS=$MAX_SECONDS"
      echo "quality_sweep: $t $m: $why" >&2
      echo "$t,$m,,,,,,,,$why" >>"$out"
      continue
    fi
    t1=$(date +%s.%N)
    evaluate "$dst"
    # The float model's row: the base figures of the same pass (the same tokens).
    have_row float - ||
      echo "float,-,$(stat -c %s "$model"),,$(json "$scratch/p.json" '"%.4f,%.4f" % (j["base_ppl"], j["base_ppl_stderr"])'),0,1,,ok" >>"$out"
    echo "$t,$m,$(stat -c %s "$dst"),$(json "$scratch/q.json" '"%.4f" % j["totals"]["file_bits_per_weight"]'),$(json "$scratch/p.json" '"%.4f,%.4f,%.5f,%.4f" % (j["ppl"], j["ppl_stderr"], j["kld"], j["top1_agreement"])'),$(python3 -c "print('%.1f' % ($t1 - $t0))"),ok" >>"$out"
    tail -n 1 "$out"
  done
done

for f in "${filters[@]}"; do
  hit=0
  for t in $types; do for m in $methods; do
    # shellcheck disable=SC2053
    [[ $t == ${f%%:*} && $m == ${f#*:} ]] && hit=1
  done; done
  [ $hit = 1 ] || echo "quality_sweep: '$f' matches no TYPE:METHOD (types: $types; methods: $methods)" >&2
done

png=${out%.csv}.png
gnuplot=${GNUPLOT:-gnuplot}
if ! command -v "$gnuplot" >/dev/null; then
  echo "quality_sweep: plot SKIPPED: $gnuplot is not installed (Debian: apt-get install gnuplot-nox); the CSV is $out" >&2
  exit 0
fi
# One data block per method (gnuplot index), the float model as a horizontal line.
python3 - "$out" "$scratch/plot.dat" <<'EOF'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["status"] == "ok"]
methods = sorted({r["method"] for r in rows if r["type"] != "float"})
with open(sys.argv[2], "w") as f:
    for m in methods:
        f.write('"%s"\n' % m)
        for r in sorted((r for r in rows if r["method"] == m), key=lambda r: int(r["file_bytes"])):
            f.write("%s %s %s %s %s\n" % (int(r["file_bytes"]) / 1e6, r["kld"], r["ppl"], r["ppl_stderr"], r["type"]))
        f.write("\n\n")
EOF
base_ppl=$(python3 -c "import csv,sys; print(next((r['ppl'] for r in csv.DictReader(open(sys.argv[1])) if r['type']=='float'), ''))" "$out")
"$gnuplot" <<EOF
set terminal pngcairo size 1200,520 font ",10"
set output "$png"
set datafile separator " "
set termoption noenhanced
set multiplot layout 1,2 title "$(basename "$model"): quality against file size (ctx $ctx, $chunks chunks of $(basename "$text"); calibration $nsamples x $seqlen of $(basename "$calib"))"
set key top right
set grid
set offsets graph 0.05, graph 0.05, 0, 0
set xlabel "file MB"
set ylabel "KL divergence vs float (log)"
set logscale y
plot for [i=0:*] "$scratch/plot.dat" index i using 1:2 with points pt 7 ps 0.8 lc i+1 title columnheader(1), \
     for [i=0:*] "$scratch/plot.dat" index i using 1:2:5 with labels offset 0,0.6 font ",7" tc lt i+1 noenhanced notitle
unset logscale y
set ylabel "perplexity (log)"
set logscale y
plot for [i=0:*] "$scratch/plot.dat" index i using 1:3 with points pt 7 ps 0.8 lc i+1 title columnheader(1), \
     for [i=0:*] "$scratch/plot.dat" index i using 1:3:5 with labels offset 0,0.6 font ",7" tc lt i+1 noenhanced notitle, \
     ${base_ppl:-0} with lines dashtype 2 lc rgb "black" title "float"
unset multiplot
EOF
echo "quality_sweep: wrote $out and $png"
