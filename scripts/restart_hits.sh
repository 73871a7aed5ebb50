#!/usr/bin/env bash
# What a restart of the KV pool's storage node costs the next requests (issue 25 §4; docs/store.md, "An SSD
# tier survives a restart of its node"): `crescent serve` (mock instances) replays the first WARM requests of
# a trace, its store node is SIGKILLed (the supervisor starts it again), and the next AFTER requests are
# replayed. Printed: the share of the prefix tokens the Conductor arranged to fetch from the pool that the pool
# had (crescent_pool_prefix_tokens_total{result}), before the kill and over the AFTER requests after it, for
# three store nodes: DRAM that holds the whole pool, no SSD; little DRAM, no SSD; little DRAM and an SSD tier
# that holds the pool. Run from the repository after a build:
#   scripts/restart_hits.sh [--crescent build/release/crescent] [--trace FILE] [--warm 300] [--after 100]
#                           [--time-scale 10] [--small-dram-bytes 16777216] [--large-bytes 1073741824]
set -euo pipefail
cd "$(dirname "$0")/.."
crescent=build/release/crescent
trace=../shared/traces/conversation_trace.jsonl.gz
warm=300
after=100
time_scale=10
small_dram_bytes=$((16 << 20))
large_bytes=$((1 << 30))
while [[ $# -gt 0 ]]; do
  case "$1" in
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
[[ -x $crescent ]] || { echo "restart_hits.sh: no crescent binary at $crescent (build first)" >&2; exit 2; }
[[ -f $trace ]] || { echo "restart_hits.sh: no trace at $trace" >&2; exit 2; }

work=$(mktemp -d /tmp/crescent-restart-hits.XXXXXX)
serve_pid=""
cleanup() {
  if [[ -n $serve_pid ]] && kill -0 "$serve_pid" 2>/dev/null; then
    kill -INT "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
  fi
  [[ -n ${KEEP:-} ]] && echo "kept $work" >&2 || rm -rf "$work"
}
trap cleanup EXIT

# The two parts of the trace (replay times each from its own first request).
# (head closes the pipe early: zcat's SIGPIPE is not a failure.)
zcat -f "$trace" | head -n "$warm" > "$work/warm.jsonl" || true
zcat -f "$trace" | tail -n +"$((warm + 1))" | head -n "$after" > "$work/after.jsonl" || true
[[ $(wc -l < "$work/after.jsonl") -gt 0 ]] || { echo "restart_hits.sh: $trace has no request after the first $warm" >&2; exit 2; }

# The sum of a counter's samples with `label` on the Conductor's /metrics.
metric() {
  curl -sf "http://127.0.0.1:$port/metrics" |
    awk -v name="$1" -v label="$2" 'index($0, name "{") == 1 && index($0, label) { sum += $NF } END { printf "%d\n", sum }'
}
ratio() {  # hit miss -> "0.123"
  awk -v h="$1" -v m="$2" 'BEGIN { if (h + m == 0) print "n/a"; else printf "%.3f\n", h / (h + m) }'
}

run() {  # dram_bytes ssd_bytes -> prints "hits_before misses_before hits_after misses_after adopted"
  local dram=$1 ssd=$2 run_dir="$work/run-$1-$2"
  mkdir -p "$run_dir"
  /usr/bin/python3 - "$run_dir/config.json" "$dram" "$ssd" <<'EOF'
import json, sys
c = json.load(open("configs/local.json"))
c["model"] = "llama3-8b"  # quick prefills: the replay runs at the trace's pace
c["serve"]["store_dram_bytes"] = int(sys.argv[2])
c["serve"]["store_ssd_bytes"] = int(sys.argv[3])
json.dump(c, open(sys.argv[1], "w"))
EOF
  port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$crescent" serve --config "$run_dir/config.json" --run-dir "$run_dir" --port "$port" \
    > "$run_dir/serve.log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 200); do
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
  local node_pid
  node_pid=$(pgrep -f "store node --master .*--cluster-secret-file $run_dir/cluster-secret" | head -n 1)
  [[ -n $node_pid ]] || { echo "restart_hits.sh: no store node found" >&2; exit 1; }
  kill -KILL "$node_pid"
  local new_pid=""
  for _ in $(seq 200); do
    new_pid=$(pgrep -f "store node --master .*--cluster-secret-file $run_dir/cluster-secret" | head -n 1 || true)
    [[ -n $new_pid && $new_pid != "$node_pid" ]] && grep -q "store node: segment" "$run_dir/store-node.log" && break
    sleep 0.1
  done
  sleep 1  # mounted and renewing
  "$crescent" replay "$work/after.jsonl" --url "http://127.0.0.1:$port" --time-scale "$time_scale" --json \
    > "$run_dir/after.json"
  local h1 m1
  h1=$(metric crescent_pool_prefix_tokens_total 'result="hit"')
  m1=$(metric crescent_pool_prefix_tokens_total 'result="miss"')
  local adopted
  adopted=$(grep -o "adopted [0-9]* objects" "$run_dir/store-node.log" | tail -n 1 | awk '{print $2}' || true)
  kill -INT "$serve_pid"
  wait "$serve_pid" || true
  serve_pid=""
  echo "$h0 $m0 $((h1 - h0)) $((m1 - m0)) ${adopted:-0}"
}

printf '%-28s %12s %12s %14s %10s\n' "store node" "before: hit" "after: hit" "after: tokens" "adopted"
for sizes in "$large_bytes 0" "$small_dram_bytes 0" "$small_dram_bytes $large_bytes"; do
  read -r dram ssd <<< "$sizes"
  run "$dram" "$ssd" > "$work/result"  # in this shell: the trap stops what it started
  read -r h0 m0 h1 m1 adopted < "$work/result"
  name="DRAM $((dram >> 20)) MiB"
  [[ $ssd -gt 0 ]] && name="$name + SSD $((ssd >> 20)) MiB"
  printf '%-28s %12s %12s %14s %10s\n' "$name" "$(ratio "$h0" "$m0")" "$(ratio "$h1" "$m1")" \
    "$((h1 + m1))" "$adopted"
done
