#!/usr/bin/env bash
# Live vs simulated on the calibration slice (docs/serving.md, "Live and simulated"): the first LIMIT
# requests of the conversation trace, every length divided by 32, blocks of 16 tokens, arrivals at x0.2,
# served by `crescent serve --executor cpu` (configs/cpu.json, the small model, pinned) and simulated with
# the same config and the model's profile. Prints one JSON object: both reports' mean TTFT, mean TBT and
# hit ratio, their ratios, and the live cluster's mean exposed KV transfer.
#
#   scripts/calibrate.sh [LIMIT] [--chunkwise]
#
# LIMIT defaults to 120 (~4 minutes, plus ~1 minute the first time for the profile). --chunkwise serves with
# serve.kv_stream_layers false (each chunk's KV shipped whole after its iteration): the exposed KV transfer
# without layer-by-layer streaming.
#
# Environment: CRESCENT (the binary; default build/release/crescent), WORK (where the model, profile and
# reports go; default build/calibration).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
crescent="${CRESCENT:-$root/build/release/crescent}"
work="${WORK:-$root/build/calibration}"
limit="${1:-120}"
layers=true
case "${2:-}" in
  "") ;;
  --chunkwise) layers=false ;;
  *) echo "calibrate: unknown option '$2' (usage: scripts/calibrate.sh [LIMIT] [--chunkwise])" >&2; exit 2 ;;
esac
[[ "$limit" =~ ^[0-9]+$ ]] || { echo "calibrate: LIMIT must be a number of requests, got '$limit'" >&2; exit 2; }
trace="$root/data/traces/conversation_trace.jsonl.gz"
mkdir -p "$work"
[ -x "$crescent" ] || { echo "calibrate: no $crescent (build it: cmake --build --preset release --target crescent)" >&2; exit 2; }

if [ ! -f "$work/small/config.json" ]; then
  "$crescent" model init --preset small --seed 1 --dtype bfloat16 --out "$work/small" >&2
fi
# Timed on one core while the other computes the other role, as the live cluster's two pinned instances do.
if [ ! -f "$work/small-1core-beside.json" ]; then
  taskset -c 1 "$crescent" profile --executor cpu --model "$work/small" --threads 1 --neighbour-core 0 \
    --out "$work/small-1core-beside.json" >&2
fi
/usr/bin/python3 -c 'import json, sys
c = json.load(open(sys.argv[1])); c["serve"]["kv_stream_layers"] = sys.argv[2] == "true"
json.dump(c, open(sys.argv[3], "w"), indent=2)' "$root/configs/cpu.json" "$layers" "$work/cpu.json"
common=(--config "$work/cpu.json" --model "$work/small" --profile "$work/small-1core-beside.json" --block-size 16)
"$crescent" serve "${common[@]}" --pin-cores --port 0 --replay "$trace" --length-divisor 32 --limit "$limit" \
  --time-scale 0.2 --json > "$work/live.json"
"$crescent" simulate "$trace" "${common[@]}" --length-divisor 32 --limit "$limit" --time-scale 0.2 --json \
  > "$work/simulated.json"

/usr/bin/python3 - "$work/live.json" "$work/simulated.json" "$work/cpu.json" <<'PY'
import json, sys
live_run = json.load(open(sys.argv[1]))
live, sim = live_run["policies"][0], json.load(open(sys.argv[2]))["policies"][0]
keys = ("ttft_mean_s", "ttft_p90_s", "tbt_mean_s", "hit_ratio", "completed", "rejected")
ratio = lambda k: live[k] / sim[k] if live.get(k) and sim.get(k) else None
print(json.dumps({
    "requests": live_run["requests"],
    "kv_stream_layers": json.load(open(sys.argv[3]))["serve"]["kv_stream_layers"],
    "live": {k: live.get(k) for k in keys} | {"failed": live_run["failed"],
             "kv_exposed_transfer_mean_s": live_run.get("kv_exposed_transfer_mean_s")},
    "simulated": {k: sim.get(k) for k in keys},
    "ttft_mean_live_over_simulated": ratio("ttft_mean_s"),
    "tbt_mean_live_over_simulated": ratio("tbt_mean_s"),
    "hit_ratio_points_apart": None if live.get("hit_ratio") is None or sim.get("hit_ratio") is None
                              else 100 * (live["hit_ratio"] - sim["hit_ratio"]),
}, indent=2))
PY
