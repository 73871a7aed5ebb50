#!/usr/bin/env bash
# Checks deploy/ (docs/deploy.md) with what runs here:
#   1. every systemd unit passes `systemd-analyze verify` (the binary path replaced by the build's);
#   2. the units' own ExecStart lines, expanded from an environment file as systemd would, start a cluster on
#      loopback around a local etcd (store master and node, Conductor, prefill@0 and decode@0) that serves a
#      replay without a failure; the instances, stopped with their KillSignal, drain and exit 0;
#   3. the Kubernetes manifests parse and hold what docs/deploy.md says (python3-yaml), their cluster config is
#      one crescent accepts, and `kubectl apply --dry-run=client` passes where a kubectl can reach an API
#      server (skipped with a message otherwise).
# Usage: deploy_test.sh CRESCENT_BINARY SOURCE_DIR. Exit 77 (skipped) without systemd-analyze or etcd.
set -euo pipefail
crescent=$1
source_dir=$2
work=$(mktemp -d /tmp/crescent-deploy.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2> /dev/null || true; done
  wait 2> /dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "deploy_test: FAIL: $*" >&2
  for log in "$work"/*.log; do [ -f "$log" ] && { echo "--- $log" >&2; tail -n 15 "$log" >&2; }; done
  exit 1
}
for tool in systemd-analyze etcd; do
  command -v "$tool" > /dev/null || { echo "deploy_test: skipped: no $tool on this machine"; exit 77; }
done
python=/usr/bin/python3
free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# 1. systemd-analyze verify: an error or a warning about any unit fails.
units="$source_dir/deploy/systemd"
mkdir "$work/units"
for unit in "$units"/*.service; do
  name=$(basename "$unit")
  name=${name/@./@0.}  # a template is verified as its instance 0
  sed -e "s|/usr/local/bin/crescent|$crescent|" -e "s|/etc/crescent/crescent.env|$work/crescent.env|" \
    "$unit" > "$work/units/$name"
done
cp "$units/crescent.env" "$work/crescent.env"
verify=$(SYSTEMD_LOG_LEVEL=notice systemd-analyze verify "$work"/units/*.service 2>&1) ||
  fail "systemd-analyze verify: $verify"
[ -z "$verify" ] || fail "systemd-analyze verify warns: $verify"
echo "deploy_test: $(ls "$work/units" | wc -l) units verified"

# 2. The units' ExecStart lines, run as systemd would run them (with this test's environment file).
etcd_port=$(free_port)
etcd_peer=$(free_port)
etcd --data-dir "$work/etcd-data" --name deploy --listen-client-urls "http://127.0.0.1:$etcd_port" \
  --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-cluster "deploy=http://127.0.0.1:$etcd_peer" > "$work/etcd.log" 2>&1 &
pids+=($!)
"$python" - "$source_dir/configs/local.json" "$work/cluster.json" << 'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["prefill_instances"] = config["decode_instances"] = 1
json.dump(config, open(sys.argv[2], "w"))
PY
"$crescent" serve secret "$work/cluster-secret" > /dev/null
store_port=$(free_port)
http_port=$(free_port)
cat > "$work/crescent.env" << ENV
CRESCENT_ETCD=http://127.0.0.1:$etcd_port
CRESCENT_CONFIG=$work/cluster.json
CRESCENT_CLUSTER_SECRET_FILE=$work/cluster-secret
CRESCENT_STORE_LISTEN=127.0.0.1:$store_port
CRESCENT_STORE_METRICS=127.0.0.1:$(free_port)
CRESCENT_NODE_DRAM=256MiB
CRESCENT_NODE_METRICS=127.0.0.1:$(free_port)
CRESCENT_HTTP_HOST=127.0.0.1
CRESCENT_HTTP_PORT=$http_port
CRESCENT_CONTROL_PORT=$(free_port)
ENV
set -a
# shellcheck disable=SC1091
. "$work/crescent.env"
set +a
for _ in $(seq 100); do grep -q "ready to serve client requests" "$work/etcd.log" && break; sleep 0.1; done
# run UNIT LOG: its ExecStart line, %i as 0 and %H as this host's name, ${VAR}s from the environment file.
run() {  # UNIT LOG NAME: the pid goes to pid_NAME
  local line log=$2 name=$3
  line=$(sed -n 's/^ExecStart=//p' "$work/units/$1")
  line=${line//%i/0}
  line=${line//%H/$(hostname)}
  eval "set -- $line"
  "$@" > "$work/$log.log" 2>&1 &
  pids+=($!)
  printf -v "pid_$name" '%s' "$!"
}
wait_for() {  # LOG TEXT SECONDS
  for _ in $(seq $(($3 * 10))); do grep -q "$2" "$work/$1.log" 2> /dev/null && return 0; sleep 0.1; done
  fail "$1 did not print '$2' within $3 s"
}
run crescent-store-master.service store-master master
wait_for store-master "store master: leading" 30
run crescent-store-node.service store-node node
wait_for store-node "store node: segment" 30
run crescent-conductor.service conductor conductor
wait_for conductor "conductor: model" 30
run crescent-prefill@0.service prefill prefill
run crescent-decode@0.service decode decode
wait_for conductor "conductor: prefill-0 up" 60
wait_for conductor "conductor: decode-0 up" 60
"$crescent" replay "$source_dir/data/traces/conversation_trace.jsonl.gz" --url "http://127.0.0.1:$http_port" \
  --limit 20 --time-scale 4 --length-divisor 4 --block-size 128 --json > "$work/replay.json" 2> "$work/replay.log" ||
  fail "the replay failed: $(tail -n 3 "$work/replay.log")"
"$python" - "$work/replay.json" << 'PY' || fail "the replay's report"
import json, sys
report = json.load(open(sys.argv[1]))
assert report["failed"] == 0, report
assert report["policies"][0]["completed"] == 20, report["policies"][0]
PY
echo "deploy_test: the units' command lines served 20 requests"
# The instances' KillSignal (SIGTERM) drains them; they exit 0 well within TimeoutStopSec.
for role in prefill decode; do
  pid_var=pid_$role
  kill -TERM "${!pid_var}"
  for _ in $(seq 450); do kill -0 "${!pid_var}" 2> /dev/null || break; sleep 0.1; done
  kill -0 "${!pid_var}" 2> /dev/null && fail "$role did not stop within TimeoutStopSec (45 s)"
  status=0
  wait "${!pid_var}" || status=$?
  [ "$status" -eq 0 ] || fail "$role exited $status after SIGTERM"
  grep -q "drained; stopping" "$work/$role.log" || fail "$role did not drain"
done
echo "deploy_test: the instances drained on SIGTERM and exited 0"

# 3. The Kubernetes manifests.
manifests="$source_dir/deploy/k8s/crescent.yaml"
"$python" - "$manifests" "$work/k8s-cluster.json" << 'PY' || fail "the Kubernetes manifests"
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
def containers(name, kind):
    return by_name[(kind, name)]["spec"]["template"]["spec"]["containers"]
# Each role, as docs/deploy.md lists it.
for kind, name in [("Deployment", "crescent-store-master"), ("StatefulSet", "crescent-store-node"),
                   ("Deployment", "crescent-conductor"), ("StatefulSet", "crescent-prefill"),
                   ("StatefulSet", "crescent-decode"), ("Service", "crescent"), ("ConfigMap", "crescent-config")]:
    assert (kind, name) in by_name, f"no {kind} {name}"
for kind, name in by_name:
    if kind in ("Deployment", "StatefulSet"):
        spec = by_name[(kind, name)]["spec"]
        assert spec["selector"]["matchLabels"] == spec["template"]["metadata"]["labels"], name
        for c in spec["template"]["spec"]["containers"]:
            command = " ".join(c["command"])
            assert "--etcd http://etcd:2379" in command, (name, command)
            env = {e["name"]: e for e in c.get("env", [])}
            assert "CRESCENT_CLUSTER_SECRET_FILE" in env, name  # every role is a member
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert "/etc/crescent/secret" in mounts, name
conductor = containers("crescent-conductor", "Deployment")[0]
assert conductor["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
assert by_name[("Deployment", "crescent-conductor")]["spec"]["replicas"] >= 2  # a standby
service = by_name[("Service", "crescent")]["spec"]
assert service["selector"] == {"app": "crescent-conductor"} and service["ports"][0]["port"] == 8000
for role in ("prefill", "decode"):
    spec = by_name[("StatefulSet", f"crescent-{role}")]["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] > 30, "longer than the drain timeout"
    assert '--index "${HOSTNAME##*-}"' in spec["containers"][0]["command"][2], "the ordinal is the index"
json.dump(json.loads(by_name[("ConfigMap", "crescent-config")]["data"]["cluster.json"]), open(sys.argv[2], "w"))
PY
"$crescent" simulate "$source_dir/data/traces/conversation_trace.jsonl.gz" --config "$work/k8s-cluster.json" \
  --limit 10 > "$work/simulate.log" 2>&1 || fail "crescent does not accept the ConfigMap's cluster.json"
# A StatefulSet pod's index as its command line derives it.
index=$(HOSTNAME=crescent-prefill-12 sh -c 'echo "${HOSTNAME##*-}"')
[ "$index" = 12 ] || fail "pod crescent-prefill-12 gets index '$index'"
echo "deploy_test: the Kubernetes manifests hold every role"
if command -v kubectl > /dev/null && kubectl version --request-timeout=3s > /dev/null 2>&1; then
  kubectl apply --dry-run=server -f "$manifests" > "$work/kubectl.log" 2>&1 ||
    fail "kubectl apply --dry-run=server: $(tail -n 3 "$work/kubectl.log")"
  echo "deploy_test: kubectl apply --dry-run=server passed"
else
  echo "deploy_test: kubectl dry-run skipped: no kubectl that reaches an API server here (the manifests were checked by structure)"
fi
echo "deploy_test: PASS"
