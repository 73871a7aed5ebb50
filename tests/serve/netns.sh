# Hosts made of network namespaces, for scripts that run crescent's roles as if on machines of their own
# (tests/serve/multihost_test.sh, scripts/chaos.sh). Sourced, not run. Each host is a network namespace with
# a veth on a bridge that lives in a namespace of its own, an address on SUBNET.0/24 that exists only inside
# the namespaces, and, for each process started there, its own hostname, /tmp and /dev/shm (unshare).
#
#   source tests/serve/netns.sh
#   work=DIR                               # where each process's log goes (DIR/NAME.log)
#   netns_setup TAG SUBNET HOST...         # e.g. netns_setup "cr$$" 10.213.0 etcd conductor ...: address[HOST]
#   netns_stage CRESCENT SOURCE_DIR NAME   # $stage, $crescent, $config, $secret under /var/tmp
#   run_on HOST NAME CMD...                # in the background; its pid in $run_on_pid
#   wait_for NAME PATTERN SECONDS          # PATTERN in DIR/NAME.log, or fail
#
# Needs root (ip netns, unshare): netns_setup exits 77 (ctest: skipped) with a message where namespaces cannot
# be made. netns_cleanup (installed as the EXIT trap by netns_setup, also reached on Ctrl-C or SIGTERM) stops
# everything run_on started by PID and deletes every namespace and the staging directory. A script that needs
# more at exit defines netns_before_cleanup.

declare -A address
pids=()             # every process run_on started, for cleanup
netns_hosts=()
netns_tag=""
stage=""
run_on_pid=""
run_on_append=0     # 1: a process's log is appended to (a restarted role keeps its predecessors' lines)

skip() {
  echo "SKIPPED: $*"
  exit 77
}

fail() {
  echo "FAILED: $*"
  for f in "$work"/*.log; do
    [ -f "$f" ] || continue
    echo "--- $f"
    tail -n 15 "$f"
  done
  exit 1
}

# ours PID: PID is a process this script started and that still runs (not an unrelated process that was given
# the pid of one of ours that ended).
ours() {
  [ "$(ps -o ppid= -p "$1" 2> /dev/null | tr -d ' ')" = "$$" ]
}

netns_cleanup() {
  trap - EXIT INT TERM
  declare -F netns_before_cleanup > /dev/null && netns_before_cleanup
  local pid live=()
  for pid in "${pids[@]}"; do ours "$pid" && live+=("$pid"); done
  # A stopped process acts on SIGTERM only once it runs again.
  for pid in "${live[@]}"; do kill -CONT "$pid" 2> /dev/null; kill -TERM "$pid" 2> /dev/null; done
  for pid in "${live[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2> /dev/null
  done
  wait 2> /dev/null
  local h
  for h in "${netns_hosts[@]}"; do ip netns del "$netns_tag-$h" 2> /dev/null; done
  [ -n "$netns_tag" ] && ip netns del "$netns_tag-sw" 2> /dev/null
  [ -n "$stage" ] && rm -rf "$stage"
}

# netns_setup TAG SUBNET HOST...: the bridge and one namespace per host, HOST at SUBNET.10, .11, ...
netns_setup() {
  netns_tag=$1
  local subnet=$2 switch="$1-sw" h ns i=10
  shift 2
  [ "$(id -u)" -eq 0 ] || skip "network namespaces need root"
  command -v ip > /dev/null && command -v unshare > /dev/null || skip "ip (iproute2) and unshare are needed"
  trap netns_cleanup EXIT
  trap 'exit 130' INT TERM  # through the EXIT trap
  ip netns add "$switch" 2> /dev/null || skip "cannot create a network namespace here (ip netns add failed)"
  ip -n "$switch" link add br0 type bridge && ip -n "$switch" link set br0 up || skip "no bridge in a namespace"
  for h in "$@"; do
    ns="$netns_tag-$h"
    address[$h]="$subnet.$i"
    i=$((i + 1))
    ip netns add "$ns" || fail "ip netns add $ns"
    netns_hosts+=("$h")
    # The veth's end in the switch is named after the host: at most 15 characters.
    ip -n "$switch" link add "p-$h" type veth peer name eth0 netns "$ns" || fail "veth for $h"
    ip -n "$switch" link set "p-$h" master br0 up
    ip -n "$ns" addr add "${address[$h]}/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  done
}

# netns_stage CRESCENT SOURCE_DIR NAME: what the hosts run and read, outside /tmp (each host has a /tmp of its
# own, so a build tree or a clone under /tmp would not be there): the binary with the modules it loads from
# beside it, the config, the members' secret. Sets stage, crescent, config and secret.
netns_stage() {
  local binary=$1 source_dir=$2
  stage=$(mktemp -d "/var/tmp/crescent-$3.XXXXXX") || fail "cannot create a staging directory in /var/tmp"
  cp "$binary" "$stage/" && cp "$(dirname "$binary")"/lib*.so "$stage/" 2> /dev/null
  cp "$source_dir/configs/local.json" "$stage/" || fail "cannot stage the binary and the config in $stage"
  crescent="$stage/$(basename "$binary")"
  config="$stage/local.json"
  secret="$stage/cluster-secret"
  "$crescent" serve secret "$secret" > /dev/null || fail "cannot write the cluster secret"
}

# run_on HOST NAME CMD...: runs CMD as host HOST (its network namespace, hostname, and a /tmp and /dev/shm of
# its own, empty at each start as after a reboot) in the background, output to WORK/NAME.log. `ip netns exec`,
# unshare and sh each exec the next, so the pid ($run_on_pid) is CMD's own: signals sent to it reach CMD.
run_on() {
  local h=$1 name=$2
  shift 2
  if [ "$run_on_append" = 1 ]; then
    echo "=== $(date +%T.%3N) started: $*" >> "$work/$name.log"
  else
    : > "$work/$name.log"
  fi
  ip netns exec "$netns_tag-$h" unshare --uts --mount --propagation private \
    sh -c 'hostname "$0" && mount -t tmpfs tmpfs /dev/shm && mount -t tmpfs tmpfs /tmp && exec "$@"' \
    "$netns_tag-$h" "$@" >> "$work/$name.log" 2>&1 &
  run_on_pid=$!
  pids+=("$run_on_pid")
}

# wait_for NAME PATTERN SECONDS: waits up to SECONDS for PATTERN in WORK/NAME.log, else fails.
wait_for() {
  local _
  for _ in $(seq $(($3 * 10))); do
    grep -q -- "$2" "$work/$1.log" 2> /dev/null && return 0
    sleep 0.1
  done
  fail "$1 did not print '$2' within $3 s"
}
