#!/usr/bin/env bash
# What a restart costs the requests after it (issue 25 §4; docs/store.md, "An SSD tier survives a restart of
# its node"; docs/serving.md, "A prefill instance keeps its cache across a restart"). `crescent serve` (mock
# instances of llama3-8b) replays the first WARM requests of a trace; then the restarted roles are SIGKILLed
# (the supervisor starts them again) and the next AFTER requests are replayed.
#   --role store-node: the pool's node. Printed: the share of the prefix tokens the Conductor arranged to
#     fetch from the pool that the pool had (crescent_pool_prefix_tokens_total{result}), before the kill and
#     over the AFTER requests, for a node whose DRAM holds the pool, one with little DRAM, and one with
#     little DRAM and an SSD tier.
#   --role prefill: every prefill instance. Printed: the replay's prefix hit ratio (cached prompt tokens /
#     prompt tokens) of the WARM and of the AFTER requests, with no restart, a restart, and a restart with
#     serve.keep_prefill_cache.
# Run from the repository after a build:
#   scripts/restart_hits.sh [--role store-node|prefill] [--crescent build/release/crescent] [--trace FILE]
#                           [--warm 300] [--after 100] [--time-scale 10]
#                           [--small-dram-bytes 16777216] [--large-bytes 1073741824]
set -euo pipefail
cd "$(dirname "$0")/.."
role=store-node
crescent=build/release/crescent
trace=../shared/traces/conversation_trace.jsonl.gz
warm=300
after=100
time_scale=10
small_dram_bytes=$((16 << 20))
large_bytes=$((1 << 30))
while [[ $# -gt 0 ]]; do
  case "$1" in
    --role) role=$2; shift 2 ;;
    --crescent) crescent=$2; shift 2 ;;
    --trace) trace=$2; shift 2 ;;
    --warm) warm=$2; shift 2 ;;
    --after) after=$2; shift 2 ;;
    --time-scale) time_scale=$2; shift 2 ;;
    --small-dram-bytes) small_dram_bytes=$2; shift 2 ;;
    --large-bytes) large_bytes=$2; shift 2 ;;
    *) echo "restart_hits.sh: unknown argument '$1' (see the comment at the top)" >&2; exit 2 ;;
  esac
done
[[ $role == store-node || $role == prefill ]] || { echo "restart_hits.sh: --role store-node or prefill" >&2; exit 2; }
[[ -x $crescent ]] || { echo "restart_hits.sh: no crescent binary at $crescent (build first)" >&2; exit 2; }
[[ -f $trace ]] || { echo "restart_hits.sh: no trace at $trace" >&2; exit 2; }

work=$(mktemp -d /tmp/crescent-restart-hits.XXXXXX)
serve_pid=""
cleanup() {
  if [[ -n $serve_pid ]] && kill -0 "$serve_pid" 2>/dev/null; then
    kill -INT "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
  fi
  if [[ -n ${KEEP:-} ]]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

# The two parts of the trace (replay times each from its own first request). head closes the pipe early:
# zcat's SIGPIPE is not a failure.
zcat -f "$trace" | head -n "$warm" > "$work/warm.jsonl" || true
zcat -f "$trace" | tail -n +"$((warm + 1))" | head -n "$after" > "$work/after.jsonl" || true
[[ $(wc -l < "$work/after.jsonl") -gt 0 ]] ||
  { echo "restart_hits.sh: $trace has no request after the first $warm" >&2; exit 2; }

# The sum of a counter's samples with `label` on the Conductor's /metrics.
metric() {
  curl -sf "http://127.0.0.1:$port/metrics" |
    awk -v name="$1" -v label="$2" 'index($0, name "{") == 1 && index($0, label) { sum += $NF } END { printf "%d\n", sum }'
}
ratio() {  # hit miss -> "0.123"
  awk -v h="$1" -v m="$2" 'BEGIN { if (h + m == 0) print "n/a"; else printf "%.3f\n", h / (h + m) }'
}
hit_ratio() {  # replay JSON -> its prefix hit ratio
  /usr/bin/python3 -c 'import json, sys; print("%.3f" % json.load(open(sys.argv[1]))["policies"][0]["hit_ratio"])' "$1"
}
# The pid of child `name` of the run in `run_dir`, as its supervisor last started it.
child_pid() {
  grep -o "started $2 (pid [0-9]*)" "$1/serve.log" | tail -n 1 | grep -o '[0-9]*)' | tr -d ')'
}

# Runs one cluster: `run DRAM_BYTES SSD_BYTES KEEP_PREFILL_CACHE VICTIMS...` (no victim: no restart); prints
# "pool_hits_before pool_misses_before pool_hits_after pool_misses_after warm_hit_ratio after_hit_ratio
# adopted".
run() {
  local dram=$1 ssd=$2 keep=$3
  shift 3
  local run_dir="$work/run-$dram-$ssd-$keep-$#"
  mkdir -p "$run_dir"
  /usr/bin/python3 - "$run_dir/config.json" "$dram" "$ssd" "$keep" <<'EOF'
import json, sys
c = json.load(open("configs/local.json"))
c["model"] = "llama3-8b"  # quick prefills: the replay runs at the trace's pace
c["serve"]["store_dram_bytes"] = int(sys.argv[2])
c["serve"]["store_ssd_bytes"] = int(sys.argv[3])
c["serve"]["keep_prefill_cache"] = sys.argv[4] == "true"
json.dump(c, open(sys.argv[1], "w"))
EOF
  port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$crescent" serve --config "$run_dir/config.json" --run-dir "$run_dir/run" --port "$port" \
    > "$run_dir/serve.log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    sleep 0.1
  done
  curl -sf "http://127.0.0.1:$port/health" > /dev/null || { cat "$run_dir/serve.log" >&2; exit 1; }
  "$crescent" replay "$work/warm.jsonl" --url "http://127.0.0.1:$port" --time-scale "$time_scale" --json \
    > "$run_dir/warm.json"
  sleep 2  # the last spills reach the SSD tier
  local h0 m0
  h0=$(metric crescent_pool_prefix_tokens_total 'result="hit"')
  m0=$(metric crescent_pool_prefix_tokens_total 'result="miss"')
  local victim
  for victim in "$@"; do
    kill -KILL "$(child_pid "$run_dir" "$victim")"
  done
  local ready
  for victim in "$@"; do
    ready="conductor: $victim up"  # an instance: the Conductor has it again
    [[ $victim == store-node ]] && ready="store node: segment"
    for _ in $(seq 300); do
      [[ $(grep -c "$ready" "$run_dir/serve.log") -ge 2 ]] && break
      sleep 0.1
    done
  done
  sleep 1  # mounted and renewing; instances' full cache reports in
  "$crescent" replay "$work/after.jsonl" --url "http://127.0.0.1:$port" --time-scale "$time_scale" --json \
    > "$run_dir/after.json"
  local h1 m1 adopted
  h1=$(metric crescent_pool_prefix_tokens_total 'result="hit"')
  m1=$(metric crescent_pool_prefix_tokens_total 'result="miss"')
  adopted=$( (grep -o "adopted [0-9]* \(objects\|blocks\)" "$run_dir/serve.log" || true) |
    awk '{ sum += $2 } END { printf "%d\n", sum }')
  kill -INT "$serve_pid"
  wait "$serve_pid" || true
  serve_pid=""
  echo "$h0 $m0 $((h1 - h0)) $((m1 - m0)) $(hit_ratio "$run_dir/warm.json") $(hit_ratio "$run_dir/after.json") $adopted"
}

if [[ $role == store-node ]]; then
  printf '%-28s %12s %12s %14s %10s\n' "store node" "before: hit" "after: hit" "after: tokens" "adopted"
  for sizes in "$large_bytes 0" "$small_dram_bytes 0" "$small_dram_bytes $large_bytes"; do
    read -r dram ssd <<< "$sizes"
    run "$dram" "$ssd" false store-node > "$work/result"  # in this shell: the trap stops what it started
    read -r h0 m0 h1 m1 _ _ adopted < "$work/result"
    name="DRAM $((dram >> 20)) MiB"
    [[ $ssd -gt 0 ]] && name="$name + SSD $((ssd >> 20)) MiB"
    printf '%-28s %12s %12s %14s %10s\n' "$name" "$(ratio "$h0" "$m0")" "$(ratio "$h1" "$m1")" \
      "$((h1 + m1))" "$adopted"
  done
else
  printf '%-34s %14s %14s %10s\n' "prefill instances" "warm: hit" "after: hit" "adopted"
  for variant in "no restart" "restarted" "restarted, keep_prefill_cache"; do
    case "$variant" in
      "no restart") run "$large_bytes" 0 false > "$work/result" ;;
      "restarted") run "$large_bytes" 0 false prefill-0 prefill-1 > "$work/result" ;;
      *) run "$large_bytes" 0 true prefill-0 prefill-1 > "$work/result" ;;
    esac
    read -r _ _ _ _ warm_hit after_hit adopted < "$work/result"
    printf '%-34s %14s %14s %10s\n' "$variant" "$warm_hit" "$after_hit" "$adopted"
  done
fi
