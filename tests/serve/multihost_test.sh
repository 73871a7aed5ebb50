#!/usr/bin/env bash
# The whole cluster across hosts (issue 21 §5): every role alone on a host of its own — a network namespace
# with its own hostname, /tmp and /dev/shm — found through etcd. A replay of a trace slice must complete every
# request, with KV checksums verified on arrival and every prefill -> decode transfer over tcp (no two roles
# share a host, so shm must never be chosen).
#
#   multihost_test.sh CRESCENT_BINARY SOURCE_DIR WORK_DIR
#
# Needs root (ip netns, unshare); exits 77 (ctest: skipped) with a message where namespaces cannot be made.
# Only addresses inside the namespaces are used (10.213.0.0/24 on a bridge in a namespace of its own);
# everything it starts is stopped by PID and every namespace is deleted on exit.
set -uo pipefail
crescent=$1 source_dir=$2 work=$3
requests=${CRESCENT_MULTIHOST_REQUESTS:-40}
hosts=(etcd conductor store prefill0 prefill1 decode0 decode1)
source "$(dirname "$0")/netns.sh"

command -v etcd > /dev/null || skip "etcd is not installed"
rm -rf "$work" && mkdir -p "$work" || fail "cannot create $work"
# 10.213.0.0/24 is this test's (scripts/chaos.sh uses 10.213.1.0/24): the two could run at once.
netns_setup "cr$$" 10.213.0 "${hosts[@]}"
netns_stage "$crescent" "$source_dir" multihost
tag=$netns_tag

etcd_url="http://${address[etcd]}:2379"
run_on etcd etcd etcd --data-dir "$stage/etcd-data" --name multihost \
  --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
  --listen-peer-urls "http://${address[etcd]}:2380" --initial-advertise-peer-urls "http://${address[etcd]}:2380" \
  --initial-cluster "multihost=http://${address[etcd]}:2380"
wait_for etcd "ready to serve client requests" 30

# The store: master (transfer metadata in etcd, as every member finds it) and one node.
run_on store store-master "$crescent" store master --etcd "$etcd_url" --metrics "" \
  --cluster-secret-file "$secret"
wait_for store-master "store master: leading" 30
run_on store store-node "$crescent" store node --etcd "$etcd_url" --dram 256MiB --metrics "" --name node-0 \
  --cluster-secret-file "$secret"
wait_for store-node "store node: segment" 30
master_address=$(sed -n 's/^store master on \([^ ]*\) .*/\1/p' "$work/store-master.log")
case "$master_address" in 10.213.*) ;; *) fail "the store master advertises '$master_address', not its own host's address" ;; esac

run_on conductor conductor "$crescent" serve conductor --config "$config" --host "${address[conductor]}" \
  --port 8000 --etcd "$etcd_url" --cluster-secret-file "$secret"
wait_for conductor "conductor: model" 30
for role in prefill decode; do
  for index in 0 1; do
    extra=()
    [ "$role" = prefill ] && extra=(--store-master "$master_address")
    run_on "$role$index" "$role-$index" "$crescent" serve "$role" --index "$index" --config "$config" \
      --etcd "$etcd_url" --cluster-secret-file "$secret" "${extra[@]}"
  done
done
for role in prefill-0 prefill-1 decode-0 decode-1; do wait_for conductor "conductor: $role up" 60; done

url="http://${address[conductor]}:8000"
ip netns exec "$tag-conductor" "$crescent" replay "$source_dir/data/traces/conversation_trace.jsonl.gz" \
  --url "$url" --limit "$requests" --time-scale 2 --json > "$work/replay.json" 2> "$work/replay.log" ||
  fail "the replay failed: $(tail -n 3 "$work/replay.log")"
# GET /metrics with bash alone (no HTTP client is a dependency).
ip netns exec "$tag-conductor" bash -c 'exec 3<> "/dev/tcp/$0/8000" && printf "GET /metrics HTTP/1.0\r\n\r\n" >&3 &&
  timeout 10 cat <&3' "${address[conductor]}" > "$work/metrics.txt" || fail "no /metrics"

metric() { awk -v name="$1" '$1 == name { print $2 }' "$work/metrics.txt"; }
completed=$(sed -n 's/.*"completed": \([0-9]*\).*/\1/p' "$work/replay.json" | head -n 1)
failed=$(sed -n 's/.*"failed": \([0-9]*\).*/\1/p' "$work/replay.json" | head -n 1)
verified=$(metric crescent_kv_blocks_verified_total)
checksum_failures=$(metric crescent_kv_checksum_failures_total)
tcp_bytes=$(metric 'crescent_kv_prefill_to_decode_bytes_total{transport="tcp"}')
shm_bytes=$(metric 'crescent_kv_prefill_to_decode_bytes_total{transport="shm"}')
echo "completed $completed of $requests, failed $failed; KV blocks verified $verified, checksum failures" \
  "$checksum_failures; prefill -> decode bytes over tcp ${tcp_bytes:-0}, over shm ${shm_bytes:-0}"
[ "$completed" = "$requests" ] || fail "$completed of $requests requests completed"
[ "$failed" = 0 ] || fail "$failed requests failed"
awk -v v="${verified:-0}" 'BEGIN { exit !(v > 0) }' || fail "no KV block was verified at decode"
[ "${checksum_failures:-0}" = 0 ] || fail "$checksum_failures KV blocks failed their checksum"
awk -v v="${tcp_bytes:-0}" 'BEGIN { exit !(v > 0) }' || fail "no KV went prefill -> decode over tcp"
[ -z "$shm_bytes" ] || fail "KV went over shm between hosts ($shm_bytes bytes)"
echo "PASSED"
