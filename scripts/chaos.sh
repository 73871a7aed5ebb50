#!/usr/bin/env bash
# The chaos run (issue 25 §5; docs/serving.md, "A chaos run"): the whole cluster across hosts (one role per
# network namespace, as tests/serve/multihost_test.sh) serves a replay of the conversation trace while, for a
# bounded time and from a seed, a fault loop SIGKILLs, SIGSTOPs/SIGCONTs and SIGTERMs random roles (store
# masters and nodes, Conductors, prefill and decode instances) and restarts what went down, as a service
# manager with Restart=always would. Then it stops the faults, restarts what is down, waits for quiescence and
# checks that
#   1. every request ended: none hung, none with a malformed answer (a clean HTTP error, an SSE error event, a
#      connection a killed Conductor closed or refused are endings);
#   2. zero wrong bytes: no KV checksum failure (Conductors' metrics, every instance's and store node's log),
#      no answer whose text is not the mock model's for its seed (`crescent replay --check-mock-output`);
#   3. nothing is left behind: the leading Conductor's decode reservations, running and waiting requests are
#      0; the store master's accounting is whole (every live node's segment mounted, no put left open, no tier
#      used beyond its capacity); etcd holds as many keys and leases as when the cluster first stood, every
#      key under a lease, every instance's key naming the live process;
#   4. the metrics add up on every Conductor process alive at the end: requests received = finished
#      (vllm:request_success_total, every finished_reason) + refused (crescent_requests_rejected_total);
#   5. no role crashed: none died of SIGSEGV/SIGABRT/..., each exits 0 on the SIGTERM that ends the run, and
#      no log holds a crash's mark.
# It prints a table of the faults, the requests' outcomes and the invariants, and exits 0 only if every
# invariant holds (77: namespaces cannot be made here, as the ctest's skip).
#
#   scripts/chaos.sh [--seed N] [--duration-s S] [--requests N] [--time-scale X] [--fault-interval-s S]
#                    [--request-timeout-s S] [--work DIR] [--binary PATH]
#
#   --seed N               the fault loop's choices (bash RANDOM); default 1
#   --duration-s S         how long faults are made; default 600
#   --requests N           requests replayed; default: those the trace sends within S at the time scale
#   --time-scale X         the replay's arrival speed-up; default 1
#   --fault-interval-s S   mean time between two faults (uniform in [S/4, 7S/4]); default 4
#   --request-timeout-s S  a request not ended this long after its send is hung; default 180
#   --work DIR             logs, faults.log, the replay's JSON, metrics; default /tmp/crescent-chaos
#   --binary PATH          the crescent binary; default build/release/crescent
#
# Needs root (ip netns, unshare), etcd and etcdctl (Debian's etcd-server, etcd-client). Only addresses inside
# the namespaces are used (10.213.1.0/24; multihost_test.sh has 10.213.0.0/24); everything it starts is
# stopped by PID and every namespace is deleted on exit, Ctrl-C included.
set -uo pipefail
source_dir=$(cd "$(dirname "$0")/.." && pwd)
seed=1 duration_s=600 requests="" time_scale=1 fault_interval_s=4 request_timeout_s=180
work=/tmp/crescent-chaos binary="$source_dir/build/release/crescent"
usage() {  # usage [STATUS]: the flags, then exit STATUS (2: a bad command line)
  sed -n '/^#   scripts\/chaos.sh/,/^#   --binary/p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}
while [ $# -gt 0 ]; do
  case $1 in
    --seed) seed=$2 ;;
    --duration-s) duration_s=$2 ;;
    --requests) requests=$2 ;;
    --time-scale) time_scale=$2 ;;
    --fault-interval-s) fault_interval_s=$2 ;;
    --request-timeout-s) request_timeout_s=$2 ;;
    --work) work=$2 ;;
    --binary) binary=$2 ;;
    -h | --help) usage 0 ;;
    *) echo "chaos.sh: unknown argument '$1'" >&2 && usage ;;
  esac
  [ $# -ge 2 ] || usage
  shift 2
done
for n in "$seed" "$duration_s" "$fault_interval_s" "$request_timeout_s" ${requests:+"$requests"}; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "chaos.sh: '$n' is not a whole number" >&2 && usage; }
done
trace="$source_dir/data/traces/conversation_trace.jsonl.gz"
binary=$(realpath "$binary" 2> /dev/null) && [ -x "$binary" ] || { echo "chaos.sh: no crescent binary" >&2 && exit 2; }
python=/usr/bin/python3
[ -x "$python" ] || python=python3

source "$source_dir/tests/serve/netns.sh"
command -v etcd > /dev/null || skip "etcd is not installed"
command -v etcdctl > /dev/null || skip "etcdctl is not installed (Debian's etcd-client; scripts/install-deps.sh)"
rm -rf "$work" && mkdir -p "$work" || fail "cannot create $work"

# Every role alone on a host; the replay from a client host of its own.
masters=(master0 master1) nodes=(node0 node1) conductors=(conductor0 conductor1)
prefills=(prefill0 prefill1 prefill2) decodes=(decode0 decode1 decode2)
roles=("${masters[@]}" "${nodes[@]}" "${conductors[@]}" "${prefills[@]}" "${decodes[@]}")
classes=(conductor master node prefill decode)
netns_setup "ch$$" 10.213.1 etcd "${roles[@]}" client
netns_stage "$binary" "$source_dir" chaos
# The cluster's size is 3 + 3 instances (local.json's is 2 + 2: index 2 would join as an extra).
sed -i 's/"prefill_instances": [0-9]*/"prefill_instances": 3/; s/"decode_instances": [0-9]*/"decode_instances": 3/' \
  "$config"
grep -q '"prefill_instances": 3' "$config" || fail "cannot set the instance counts in $config"
run_on_append=1  # a restarted role's log goes on after its predecessors'
etcd_url="http://${address[etcd]}:2379"
faults_log="$work/faults.log"
: > "$faults_log"

# --- time, logging --------------------------------------------------------------------------------------
start_ms=0
now=0
clock() { now=$((${EPOCHREALTIME/./} / 1000)); }  # milliseconds, without a subshell
clock
start_ms=$now
# note MESSAGE: a timestamped line in faults.log and on stdout.
note() {
  clock
  local line
  printf -v line '%s +%6ss %s' "$(date +%T.%3N)" "$(secs $((now - start_ms)))" "$*"
  echo "$line" >> "$faults_log"
  echo "$line"
}

# --- talking to the hosts ---------------------------------------------------------------------------------
# http_get ADDRESS PORT PATH: the whole answer (status line, headers, body), from the client host, with bash
# alone (no HTTP client is a dependency); at most 10 s (a stopped server answers nothing).
http_get() {
  ip netns exec "$netns_tag-client" timeout "${http_timeout_s:-10}" bash -c \
    'exec 3<> "/dev/tcp/$0/$1" && printf "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n" "$2" "$0" >&3 && cat <&3' \
    "$1" "$2" "$3" 2> /dev/null
}
# scrape ADDRESS PORT FILE: /metrics into FILE; fails unless the answer was 200.
scrape() {
  http_get "$1" "$2" /metrics > "$3" && head -n 1 "$3" | grep -q ' 200'
}
# metric FILE NAME: the sum of NAME's samples, every label set (0 when absent); NAME{labels}: that one sample.
metric() {
  awk -v name="$2" '$1 == name || (name !~ /}$/ && index($1, name "{") == 1) { s += $2 }
    END { printf "%.15g\n", s + 0 }' "$1"
}
# metric_is FILE SAMPLE: the value of one exact sample (NAME{labels}), empty when absent.
metric_is() { awk -v name="$2" '$1 == name { print $2 }' "$1"; }
etcdctl_() { ip netns exec "$netns_tag-client" timeout 10 etcdctl --endpoints "$etcd_url" "$@"; }
# leader_conductor: the role whose HTTP URL the leading Conductor published (empty if none).
leader_conductor() {
  local url c
  url=$(etcdctl_ get /crescent-serve/conductor-http --print-value-only 2> /dev/null)
  for c in "${conductors[@]}"; do
    [ "$url" = "http://${address[$c]}:8000" ] && echo "$c" && return
  done
}

# --- the roles ---------------------------------------------------------------------------------------------
declare -A pid state until starts started restart_ms exit_note
declare -A class  # class[ROLE]: conductor, master, node, prefill or decode
for r in "${roles[@]}"; do class[$r]=${r%%[0-9]*}; done
# secs MS: MS milliseconds as seconds with one decimal.
secs() { echo "$(($1 / 1000)).$(($1 % 1000 / 100))"; }
# start_role ROLE: starts it on its host as a service manager would, with the same flags every time (so a
# store node finds its SSD directory and a prefill instance its cache file again).
start_role() {
  local r=$1 i=${1##*[a-z]} cmd=()
  case $r in
    master*) cmd=("$crescent" store master --etcd "$etcd_url" --metrics "${address[$r]}:9151") ;;
    node*)
      # The SSD tier outlives its node: under the staging directory, not the host's /tmp (new at each start).
      # 16 MiB of DRAM holds ~400 of the replay's KV blocks: the pool evicts to SSD and reads back from it.
      cmd=("$crescent" store node --etcd "$etcd_url" --name "node-$i" --dram 16MiB --ssd "$stage/ssd-$i"
        --ssd-capacity 256MiB --metrics "${address[$r]}:9152")
      ;;
    conductor*)
      cmd=("$crescent" serve conductor --config "$config" --host "${address[$r]}" --port 8000 --etcd "$etcd_url")
      ;;
    prefill*)
      cmd=("$crescent" serve prefill --index "$i" --config "$config" --etcd "$etcd_url"
        --cache-file "$stage/prefill-$i.cache")
      ;;
    decode*) cmd=("$crescent" serve decode --index "$i" --config "$config" --etcd "$etcd_url") ;;
  esac
  run_on "$r" "$r" "${cmd[@]}" --cluster-secret-file "$secret"
  clock
  pid[$r]=$run_on_pid state[$r]=up started[$r]=$now starts[$r]=$((${starts[$r]:-0} + 1))
}
# watch_checksums: each running Conductor's KV checksum failures, every 10 s, kept per process: a Conductor
# killed later takes its count with it.
declare -A checksum_seen  # checksum_seen[PID]: the most a Conductor process reported
watched_at=0
watch_checksums() {
  [ $((now - watched_at)) -ge 10000 ] || return
  watched_at=$now
  local c n
  for c in "${conductors[@]}"; do
    [ "${state[$c]}" = up ] || continue
    http_timeout_s=2 scrape "${address[$c]}" 8000 "$work/watch.txt" || continue
    n=$(metric "$work/watch.txt" crescent_kv_checksum_failures_total)
    [ "$n" -gt "${checksum_seen[${pid[$c]}]:-0}" ] && checksum_seen[${pid[$c]}]=$n
    if [ "$n" -gt 0 ] && [ -z "${checksum_noted[${pid[$c]}]:-}" ]; then
      note "$c pid ${pid[$c]} counts $n KV checksum failure(s)"
      checksum_noted[${pid[$c]}]=1
    fi
  done
}
declare -A checksum_noted
# alive PID: the process runs (bash reaps its children, so an ended one is gone).
alive() { [ -n "$1" ] && kill -0 "$1" 2> /dev/null; }

mkdir -p "$stage/ssd-0" "$stage/ssd-1"
run_on etcd etcd etcd --data-dir "$stage/etcd-data" --name chaos \
  --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
  --listen-peer-urls "http://${address[etcd]}:2380" --initial-advertise-peer-urls "http://${address[etcd]}:2380" \
  --initial-cluster "chaos=http://${address[etcd]}:2380"
etcd_pid=$run_on_pid
wait_for etcd "ready to serve client requests" 30
for r in "${masters[@]}"; do start_role "$r"; done
for r in "${masters[@]}"; do wait_for "$r" "store master on" 30; done
for r in "${nodes[@]}" "${conductors[@]}"; do start_role "$r"; done
for r in "${nodes[@]}"; do wait_for "$r" "store node: segment" 60; done
for r in "${conductors[@]}"; do wait_for "$r" "conductor: model" 60; done
for r in "${prefills[@]}" "${decodes[@]}"; do start_role "$r"; done

# whole: the leading Conductor places on every instance (3 + 3 up) and the store has both nodes' segments.
whole() {
  local leader
  leader=$(leader_conductor)
  [ -n "$leader" ] && scrape "${address[$leader]}" 8000 "$work/whole.txt" || return 1
  [ "$(metric "$work/whole.txt" 'crescent_instances_up{role="prefill"}')" = 3 ] &&
    [ "$(metric "$work/whole.txt" 'crescent_instances_up{role="decode"}')" = 3 ] || return 1
  local m
  for m in "${masters[@]}"; do
    scrape "${address[$m]}" 9151 "$work/whole.txt" && [ "$(metric "$work/whole.txt" crescent_store_segments)" = 2 ] &&
      return 0
  done
  return 1
}
for _ in $(seq 120); do whole && break; sleep 0.5; done
whole || fail "the cluster did not stand within 60 s (3 + 3 instances up at the leading Conductor, 2 segments)"

# etcd as the cluster first stood: what must be there again once it is whole after the faults.
etcd_snapshot() {  # etcd_snapshot FILE: every key and its lease, then every lease
  etcdctl_ get --prefix "" --keys-only -w json > "$1.keys.json" &&
    etcdctl_ lease list > "$1.leases.txt"
}
# keys_and_leases FILE: "KEYS LEASES UNLEASED_KEYS".
keys_and_leases() {
  "$python" - "$1.keys.json" "$1.leases.txt" << 'EOF'
import base64, json, sys
kvs = json.load(open(sys.argv[1])).get("kvs", [])
leases = [l for l in open(sys.argv[2]) if l.strip() and not l.startswith("found ")]
print(len(kvs), len(leases), sum(1 for kv in kvs if not kv.get("lease")))
EOF
}
sleep 6  # leases of a role's first attempts (a campaign's) lapse within the 5 s TTLs
etcd_snapshot "$work/etcd-start" || fail "etcdctl cannot read etcd"
read -r keys_start leases_start unleased_start < <(keys_and_leases "$work/etcd-start")
note "cluster whole: etcd holds $keys_start keys under $leases_start leases; $(leader_conductor) leads"

# --- the replay ----------------------------------------------------------------------------------------------
if [ -z "$requests" ]; then
  # As many as the trace sends within the fault window at this time scale (its timestamps are milliseconds).
  requests=$(zcat "$trace" | awk -v d="$duration_s" -v x="$time_scale" '
    { match($0, /"timestamp": *[0-9]+/); t = substr($0, RSTART, RLENGTH); sub(/.*: */, "", t)
      if (t / x < d * 1000) n++ } END { print n + 0 }')
fi
replay_args=(replay "$trace" --limit "$requests" --time-scale "$time_scale" --request-timeout "$request_timeout_s"
  --config "$config" --json --requests-out "$work/requests.jsonl")
if "$crescent" replay --help 2>&1 | grep -q -- --check-mock-output; then
  # Round robin over both Conductors (a refused connection is tried at the other); every answer checked.
  replay_args+=(--url "http://${address[conductor0]}:8000" --url "http://${address[conductor1]}:8000"
    --check-mock-output)
else
  note "WARNING: this crescent replay has no --check-mock-output (nor several --url): one Conductor, no check"
  replay_args+=(--url "http://${address[conductor0]}:8000")
fi
# From here bash's notes on the roles it sees killed ("Killed ...") go to WORK/shell.log, not the table.
exec 3>&2 2>> "$work/shell.log"
netns_before_cleanup() { exec 2>> "$work/shell.log"; }
# The replay's JSON on stdout: the host's own /tmp is not where WORK is, so it is redirected from here.
ip netns exec "$netns_tag-client" "$crescent" "${replay_args[@]}" > "$work/replay.json" 2> "$work/replay.log" &
replay_pid=$!
pids+=("$replay_pid")
note "replay: $requests requests at time scale $time_scale against both Conductors (pid $replay_pid)"

# --- the fault loop --------------------------------------------------------------------------------------------
declare -A faults  # faults[KIND,CLASS]
crashes=""         # roles that crashed, or did not stop cleanly at the end
RANDOM=$seed
fault_kinds=(kill stop term)
grace_ms=5000  # a role started less than this long ago may not be up yet: it does not count as available
# available ROLE: it runs, is not stopped or draining, and has had time to come up.
available() { [ "${state[$1]}" = up ] && [ $((now - ${started[$1]})) -ge "$grace_ms" ]; }
# spare ROLE: taking ROLE down leaves another of its class available (store nodes: none need be).
spare() {
  local c r n=0
  c=${class[$1]}
  [ "$c" = node ] && return 0
  for r in "${roles[@]}"; do [ "${class[$r]}" = "$c" ] && available "$r" && n=$((n + 1)); done
  [ "$n" -ge 2 ]
}

# tend: what a service manager does each tick: a stopped role gets SIGCONT when its time comes, a draining one
# SIGKILL past its deadline, a role that ended is started again after its delay (one that ended by itself,
# not by a fault, after 1 s).
tend() {
  local r status
  clock
  for r in "${roles[@]}"; do
    case ${state[$r]} in
      up)
        if ! alive "${pid[$r]}"; then
          wait "${pid[$r]}" 2> /dev/null
          status=$?
          note "exit $r pid ${pid[$r]}: ended by itself (status $status); restart in 1.0 s"
          # A crash: SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV (nobody here sends those).
          case $status in 132 | 134 | 135 | 136 | 139) crashes+=" $r(pid ${pid[$r]} status $status during the run)" ;; esac
          faults[exit,${class[$r]}]=$((${faults[exit,${class[$r]}]:-0} + 1))
          state[$r]=down until[$r]=$((now + 1000))
        fi
        ;;
      stopped)
        if [ "$now" -ge "${until[$r]}" ]; then
          kill -CONT "${pid[$r]}" 2> /dev/null
          note "cont $r pid ${pid[$r]}"
          state[$r]=up
        fi
        ;;
      draining)
        if ! alive "${pid[$r]}"; then
          wait "${pid[$r]}" 2> /dev/null
          status=$?
          note "gone $r pid ${pid[$r]} after SIGTERM (status $status); restart in $(secs "${restart_ms[$r]}") s"
          state[$r]=down until[$r]=$((now + ${restart_ms[$r]}))
        elif [ "$now" -ge "${until[$r]}" ]; then
          kill -KILL "${pid[$r]}" 2> /dev/null
          note "KILL $r pid ${pid[$r]}: still running 45 s after SIGTERM"
        fi
        ;;
      down)
        if [ "$now" -ge "${until[$r]}" ]; then
          start_role "$r"
          note "start $r pid ${pid[$r]}"
        fi
        ;;
    esac
  done
}

# fault: one fault on a random role that can be spared. Every draw is made whatever is chosen, so a seed gives
# the same choices as long as the same roles can be spared.
fault() {
  local pick=$RANDOM kind=${fault_kinds[$((RANDOM % 3))]} delay=$((500 + RANDOM % 4501))
  local stop_ms=$((1000 + RANDOM % 7001)) eligible=() r c
  for r in "${roles[@]}"; do available "$r" && spare "$r" && eligible+=("$r"); done
  [ ${#eligible[@]} -gt 0 ] || { note "no role can be spared: no fault" && return; }
  r=${eligible[$((pick % ${#eligible[@]}))]}
  c=${class[$r]}
  faults[$kind,$c]=$((${faults[$kind,$c]:-0} + 1))
  case $kind in
    kill)
      kill -KILL "${pid[$r]}"
      note "kill $r pid ${pid[$r]} (SIGKILL; restart in $(secs "$delay") s)"
      state[$r]=down until[$r]=$((now + delay))
      ;;
    stop)
      kill -STOP "${pid[$r]}"
      note "stop $r pid ${pid[$r]} (SIGSTOP for $(secs "$stop_ms") s)"
      state[$r]=stopped until[$r]=$((now + stop_ms))
      ;;
    term)
      kill -TERM "${pid[$r]}"
      note "term $r pid ${pid[$r]} (SIGTERM: drain, then restart $(secs "$delay") s after it ends)"
      # Instances drain for up to --drain-timeout-s (30 s); past 45 s it is killed.
      state[$r]=draining until[$r]=$((now + 45000)) restart_ms[$r]=$delay
      ;;
  esac
}

clock
faults_end=$((now + duration_s * 1000))
interval_ms=$((fault_interval_s * 1000))
next_fault=$((now + interval_ms / 4 + RANDOM % (interval_ms * 3 / 2 + 1)))
note "faults for $duration_s s, seed $seed, one every $fault_interval_s s on average"
while clock && [ "$now" -lt "$faults_end" ]; do
  tend
  watch_checksums
  if [ "$now" -ge "$next_fault" ]; then
    fault
    next_fault=$((now + interval_ms / 4 + RANDOM % (interval_ms * 3 / 2 + 1)))
  fi
  sleep 0.2
done
note "faults over; everything down is started again"

# --- quiescence --------------------------------------------------------------------------------------------
# Stopped roles go on, ended ones start now (draining ones once they ended).
for r in "${roles[@]}"; do
  case ${state[$r]} in stopped | down) until[$r]=0 ;; esac
done
# The replay ends on its own: every request by its --request-timeout at the latest.
replay_deadline=$((now + (request_timeout_s + 120) * 1000))
while alive "$replay_pid" && clock && [ "$now" -lt "$replay_deadline" ]; do
  tend
  watch_checksums
  sleep 0.2
done
replay_hung=0
if alive "$replay_pid"; then
  replay_hung=1
  note "the replay did not end within its request timeout + 120 s: stopped"
  kill -TERM "$replay_pid"
fi
wait "$replay_pid" 2> /dev/null
replay_status=$?
note "replay ended (status $replay_status)"

# Quiet: the cluster whole again and nothing in flight at the leading Conductor.
leader=""
gauges() {  # gauges FILE: "running waiting reserved kv_usage" at the leading Conductor
  echo "$(metric "$1" vllm:num_requests_running) $(metric "$1" vllm:num_requests_waiting)" \
    "$(metric "$1" crescent_decode_kv_reserved_tokens) $(metric "$1" vllm:kv_cache_usage_perc)"
}
quiet() {
  whole || return 1
  leader=$(leader_conductor)
  [ -n "$leader" ] && scrape "${address[$leader]}" 8000 "$work/leader.txt" && [ "$(gauges "$work/leader.txt")" = "0 0 0 0" ]
}
clock
quiet_deadline=$((now + 120000))
until quiet; do
  clock
  [ "$now" -lt "$quiet_deadline" ] || break
  tend
  sleep 0.5
done
quiet && note "quiet: cluster whole, nothing in flight; $leader leads" || note "NOT quiet within 120 s"
exec 2>&3
# Nothing starts or stops from here on; leases of processes gone lapse within their 5 s TTLs.
sleep 8

# --- invariants ----------------------------------------------------------------------------------------------
declare -a results
failures=0
check() {  # check NAME OK NUMBERS
  local verdict=PASS
  [ "$2" = 1 ] || { verdict=FAIL && failures=$((failures + 1)); }
  results+=("| $1 | $verdict | $3 |")
}

# The replay's report.
read -r sent completed refused failed classes_known hung http_error sse_error closed conn_refused malformed \
  wrong_output < <("$python" - "$work/replay.json" << 'EOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception:
    print("0 0 0 0 0 0 0 0 0 0 0 0")
    sys.exit()
p = r["policies"][0]
f = r.get("failures")
names = ["hung", "http_error", "sse_error", "connection_closed", "connection_refused", "malformed", "wrong_output"]
print(r["requests"], p["completed"], p["rejected"], r["failed"], 1 if f is not None else 0,
      *[(f or {}).get(n, 0) for n in names])
EOF
)
ended=$((completed + refused + failed))
ok=0
[ "$replay_hung" = 0 ] && [ -s "$work/replay.json" ] && [ "$classes_known" = 1 ] && [ "$hung" = 0 ] &&
  [ "$malformed" = 0 ] && [ "$ended" = "$sent" ] && ok=1
check "every request ended" $ok "$ended of $sent ended; hung $hung, malformed $malformed$(
  [ "$classes_known" = 1 ] || echo ' (this replay reports no failure classes)')$(
  [ "$replay_hung" = 0 ] || echo '; the replay itself never ended')"

# Checksums: each Conductor's count (since its start), and every instance's and store node's log (which
# outlives a Conductor restart and covers an instance killed before its next report).
conductor_failures=0 verified=0
for c in "${conductors[@]}"; do
  if scrape "${address[$c]}" 8000 "$work/$c-metrics.txt"; then
    conductor_failures=$((conductor_failures + $(metric "$work/$c-metrics.txt" crescent_kv_checksum_failures_total)))
    verified=$((verified + $(metric "$work/$c-metrics.txt" crescent_kv_blocks_verified_total)))
  else
    conductor_failures="$conductor_failures+unknown($c)"
  fi
done
# What Conductors reported while running (those killed since included; a restarted Conductor counts again
# what its instances had counted before it, so this may count a failure twice).
for c in "${conductors[@]}"; do
  n=$(metric "$work/$c-metrics.txt" crescent_kv_checksum_failures_total 2> /dev/null)
  [ "${n:-0}" -gt "${checksum_seen[${pid[$c]}]:-0}" ] && checksum_seen[${pid[$c]}]=$n
done
seen_failures=0
for n in "${checksum_seen[@]}"; do seen_failures=$((seen_failures + n)); done
logged_failures=$(cat "$work"/prefill*.log "$work"/decode*.log "$work"/node*.log | grep -c 'failed its check')
ssd_dropped=0
for n in "${nodes[@]}"; do
  scrape "${address[$n]}" 9152 "$work/$n-metrics.txt" &&
    ssd_dropped=$((ssd_dropped + $(metric "$work/$n-metrics.txt" crescent_store_node_ssd_adopt_dropped_files)))
done
ok=0
[ "$conductor_failures" = 0 ] && [ "$seen_failures" = 0 ] && [ "$logged_failures" = 0 ] && [ "$classes_known" = 1 ] && [ "$wrong_output" = 0 ] &&
  ok=1
check "zero wrong bytes" $ok "KV checksum failures at the Conductors now $conductor_failures (blocks verified"\
" $verified), seen during the run $seen_failures, pool reads failing in prefill logs $logged_failures; wrong output $wrong_output$([ "$classes_known" = 1 ] || echo ' (not checked)')"

# Nothing left behind: the leading Conductor's gauges, the store master's accounting, etcd.
read -r running waiting reserved kv_usage < <(gauges "$work/leader.txt" 2> /dev/null || echo "? ? ? ?")
ok=0
[ -n "$leader" ] && [ "$running $waiting $reserved $kv_usage" = "0 0 0 0" ] && ok=1
check "no decode reservation left" $ok "leader ${leader:-none}: running $running, waiting $waiting,"\
" KV reserved tokens $reserved, KV usage $kv_usage"

store_leader="" store_numbers="no leading master answered"
ok=0
for m in "${masters[@]}"; do
  scrape "${address[$m]}" 9151 "$work/$m-metrics.txt" || continue
  leader_address=$(etcdctl_ get /crescent-store/master/leader --print-value-only 2> /dev/null)
  case $leader_address in "${address[$m]}":*) store_leader=$m ;; *) continue ;; esac
  f="$work/$m-metrics.txt"
  segments=$(metric "$f" crescent_store_segments) processing=$(metric "$f" crescent_store_processing_objects)
  objects=$(metric "$f" crescent_store_objects)
  dram_used=$(metric_is "$f" 'crescent_store_used_bytes{tier="dram"}')
  dram_cap=$(metric_is "$f" 'crescent_store_capacity_bytes{tier="dram"}')
  ssd_used=$(metric_is "$f" 'crescent_store_used_bytes{tier="ssd"}')
  ssd_cap=$(metric_is "$f" 'crescent_store_capacity_bytes{tier="ssd"}')
  node_objects=0
  for n in "${nodes[@]}"; do
    [ -f "$work/$n-metrics.txt" ] && node_objects=$((node_objects + $(metric "$work/$n-metrics.txt" crescent_store_node_objects)))
  done
  store_numbers="leader $m: segments $segments (2 nodes), puts open $processing, objects $objects (nodes hold"\
" $node_objects), DRAM ${dram_used:-?}/${dram_cap:-?} B, SSD ${ssd_used:-?}/${ssd_cap:-?} B"
  awk -v s="$segments" -v p="$processing" -v du="${dram_used:-x}" -v dc="${dram_cap:-x}" -v su="${ssd_used:-x}" \
    -v sc="${ssd_cap:-x}" -v o="$objects" -v no="$node_objects" 'BEGIN {
      exit !(s == 2 && p == 0 && du != "x" && du + 0 <= dc + 0 && su != "x" && su + 0 <= sc + 0 && o + 0 <= no + 0) }' &&
    ok=1
done
check "store pool accounting whole" $ok "$store_numbers"

etcd_snapshot "$work/etcd-end"
read -r keys_end leases_end unleased_end < <(keys_and_leases "$work/etcd-end")
stale_instances=""
for r in "${prefills[@]}" "${decodes[@]}"; do
  name="${class[$r]}-${r##*[a-z]}"
  value=$(etcdctl_ get "/crescent-serve/instances/$name" --print-value-only 2> /dev/null)
  [ "$value" = "${pid[$r]}" ] || stale_instances+=" $name=${value:-none}(live ${pid[$r]})"
done
ok=0
[ "$keys_end" = "$keys_start" ] && [ "$leases_end" = "$leases_start" ] && [ "$unleased_end" = 0 ] &&
  [ -z "$stale_instances" ] && ok=1
check "no etcd key or lease of a process gone" $ok "keys $keys_end (at the start $keys_start), leases $leases_end"\
" ($leases_start), keys under no lease $unleased_end$([ -z "$stale_instances" ] || echo "; instance keys not the live process:$stale_instances")"

# The metrics add up, per Conductor process alive now (a restarted one counts from 0).
ok=1 numbers=""
for c in "${conductors[@]}"; do
  f="$work/$c-metrics.txt"
  if [ ! -s "$f" ]; then ok=0 && numbers+="$c: no /metrics; " && continue; fi
  received=$(metric "$f" crescent_requests_received_total)
  finished=$(metric "$f" vllm:request_success_total)
  rejected=$(metric "$f" crescent_requests_rejected_total)
  failed_c=$(metric "$f" crescent_requests_failed_total)
  grep -q '^crescent_requests_received_total' "$f" || { ok=0 && received="absent"; }
  [ "$received" = "$((finished + rejected))" ] || ok=0
  numbers+="$c (pid ${pid[$c]}): received $received = finished $finished (of which failed $failed_c) + refused $rejected; "
done
check "metrics add up" $ok "${numbers%; }"

# No role crashed: each stops cleanly when asked (instances first, as a service manager stops a cluster; idle,
# they drain at once), and no log holds a crash's mark (a handler's "Caught signal", an abort, a sanitizer).
stop_group() {
  local r status _
  for r in "$@"; do kill -CONT "${pid[$r]}" 2> /dev/null; kill -TERM "${pid[$r]}" 2> /dev/null; done
  for r in "$@"; do
    for _ in $(seq 400); do alive "${pid[$r]}" || break; sleep 0.1; done
    if alive "${pid[$r]}"; then
      kill -KILL "${pid[$r]}" 2> /dev/null
      crashes+=" $r(pid ${pid[$r]} still running 40 s after SIGTERM)"
    fi
    wait "${pid[$r]}" 2> /dev/null
    status=$?
    [ "$status" = 0 ] || crashes+=" $r(pid ${pid[$r]} status $status at the stop)"
    state[$r]=stopped_for_good
  done
}
exec 2>> "$work/shell.log"
stop_group "${prefills[@]}" "${decodes[@]}"
stop_group "${conductors[@]}"
stop_group "${nodes[@]}"
stop_group "${masters[@]}"
exec 2>&3
role_logs=()
for r in "${roles[@]}"; do role_logs+=("$work/$r.log"); done
crash_marks=$(grep -c -E 'Caught signal|Segmentation fault|terminate called|Assertion .* failed|Sanitizer|core dumped' \
  "${role_logs[@]}" | awk -F: '$2 > 0 { n = split($1, p, "/"); printf " %s: %s", p[n], $2 }')
ok=0
[ -z "$crashes" ] && [ -z "$crash_marks" ] && ok=1
check "no role crashed" $ok "exits by a signal or not 0 at the stop:${crashes:- none}; crash marks in logs:${crash_marks:- none}"

# --- the table -------------------------------------------------------------------------------------------------
{
  echo
  echo "chaos run: seed $seed, $duration_s s of faults, $requests requests at time scale $time_scale"
  echo
  header="| fault |"
  for c in "${classes[@]}"; do header+=" $c |"; done
  echo "$header all |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  for kind in kill stop term exit; do
    case $kind in
      kill) label="SIGKILL, restart" ;; stop) label="SIGSTOP, SIGCONT" ;; term) label="SIGTERM, restart" ;;
      exit) label="ended by itself, restart" ;;
    esac
    total=0 row="| $label |"
    for c in "${classes[@]}"; do
      n=${faults[$kind,$c]:-0}
      total=$((total + n))
      row+=" $n |"
    done
    echo "$row $total |"
  done
  echo
  echo "| requests | n |"
  echo "|---|---:|"
  echo "| sent | $sent |"
  echo "| completed | $completed |"
  echo "| refused (429/400) | $refused |"
  echo "| failed | $failed |"
  for pair in "http error:$http_error" "SSE error event:$sse_error" "connection closed:$closed" \
    "connection refused:$conn_refused" "hung:$hung" "malformed:$malformed" "wrong output:$wrong_output"; do
    echo "| - ${pair%%:*} | ${pair##*:} |"
  done
  echo
  echo "| invariant | result | numbers |"
  echo "|---|---|---|"
  printf '%s\n' "${results[@]}"
  echo
  echo "first error: $("$python" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("first_error"))' \
    "$work/replay.json" 2> /dev/null)"
  echo "faults: $faults_log; logs, metrics and the replay's JSON: $work"
} | tee "$work/summary.md"
[ "$failures" = 0 ] || { echo "FAILED: $failures invariant(s)"; exit 1; }
echo "PASSED"
