#!/usr/bin/env bash
# CPU time (user + sys) and max RSS of `wsyncctl plan` for two builds,
# alternated (the only fair comparison on a shared, noisy host):
#   bench/plan_cli_ab.sh BEFORE/wsyncctl AFTER/wsyncctl [pairs] [-- plan args]
# Default case: Kimi-K2 Megatron 256 -> vLLM 16x8 EP, fp8 wire, --top 0.
# One line per run, then the range of each build. PAUSE=S sleeps S seconds
# before each run (default 0): memory the previous run freed is then less
# likely to be reused warm (the VM reports freed blocks to its host).
set -euo pipefail
before="$1" after="$2" pairs="${3:-4}"
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift
args=("$@")
if [ ${#args[@]} -eq 0 ]; then
  args=(--model kimi-k2 --source megatron:tp8,pp4,dp8,ep8 --destination vllm-tp:16x8,ep
        --fp8-block --top 0)
fi
log=$(mktemp)
trap 'rm -f "$log" "$log.runs"' EXIT
for rep in $(seq 1 "$pairs"); do
  for build in before after; do
    bin="$before"; [ "$build" = after ] && bin="$after"
    sleep "${PAUSE:-0}"
    /usr/bin/time -f "%U %S %M" -o "$log" "$bin" plan "${args[@]}" > /dev/null
    read -r user sys rss < "$log"
    printf "%-6s pair %d  cpu %.2f s (user %.2f sys %.2f)  max rss %d MiB  load %s\n" "$build" \
      "$rep" "$(echo "$user + $sys" | bc)" "$user" "$sys" $((rss / 1024)) \
      "$(cut -d' ' -f1 /proc/loadavg)"
  done
done > "$log.runs"
cat "$log.runs"
awk '{ cpu = $5; b = $1; r = $13
       if (!(b in lo) || cpu < lo[b]) lo[b] = cpu; if (!(b in hi) || cpu > hi[b]) hi[b] = cpu
       if (!(b in rlo) || r < rlo[b]) rlo[b] = r; if (!(b in rhi) || r > rhi[b]) rhi[b] = r }
     END { for (b in lo) printf "%-6s cpu %.2f-%.2f s, max rss %d-%d MiB\n", b, lo[b], hi[b], rlo[b], rhi[b] }' \
  "$log.runs" | sort -r
