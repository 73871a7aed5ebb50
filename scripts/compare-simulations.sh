#!/usr/bin/env bash
# Checks that two crescent binaries simulate alike, byte for byte: a change meant to make the Conductor or the
# simulator faster must not change a decision (issue 26; docs/benchmarks.md, "Conductor decisions").
#
#   scripts/compare-simulations.sh OLD_CRESCENT NEW_CRESCENT [OUT_DIR]
#
# Runs 108 simulations with each binary: both bundled traces at 8x and 30x time scale; least-loaded,
# cache-aware and global-cache-aware; admission none, predictive and slo; on paper-fig5 scaled to 64+64 and
# 128+128 instances and decode-bound scaled to 84+12 (pools of 64 instances and more, where the Conductor's
# busy order decides). Compares each report and per-request file with cmp; exits 1 on the first difference
# or failed run. The binaries are paths (./build/release/crescent), not names looked up in PATH.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 OLD_CRESCENT NEW_CRESCENT [OUT_DIR]" >&2
  exit 2
fi
old=$(realpath "$1")
new=$(realpath "$2")
out=${3:-$(mktemp -d /tmp/crescent-compare.XXXXXX)}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out/configs" "$out/old" "$out/new"

# A bundled config with its pool sizes replaced.
scaled() {  # NAME BASE PREFILL DECODE
  python3 - "$root/configs/$2.json" "$3" "$4" "$1" >"$out/configs/$1.json" <<'EOF'
import json, sys
config = json.load(open(sys.argv[1]))
config.update(name=sys.argv[4], prefill_instances=int(sys.argv[2]), decode_instances=int(sys.argv[3]))
print(json.dumps(config))
EOF
}
scaled p64 paper-fig5 64 64
scaled p128 paper-fig5 128 128
scaled db96 decode-bound 84 12

runs=0
for config in p64 p128 db96; do
  for trace in conversation synthetic; do
    for scale in 8 30; do
      for policy in least-loaded cache-aware global-cache-aware; do
        for admission in none predictive slo; do
          name=$config.$trace.x$scale.$policy.$admission
          for side in old new; do
            bin=$old
            [[ $side == new ]] && bin=$new
            if ! "$bin" simulate "$root/data/traces/${trace}_trace.jsonl.gz" --config "$out/configs/$config.json" \
              --time-scale "$scale" --policy "$policy" --admission "$admission" --json \
              --requests-out "$out/$side/$name.requests.jsonl" >"$out/$side/$name.report.json" \
              2>>"$out/$side.log"; then
              echo "FAILED: $side binary on $name (its messages: $out/$side.log)" >&2
              exit 1
            fi
          done
          for file in report.json requests.jsonl; do
            if ! cmp -s "$out/old/$name.$file" "$out/new/$name.$file"; then
              echo "DIFFERENT: $name.$file (in $out/old and $out/new)" >&2
              exit 1
            fi
          done
          runs=$((runs + 1))
        done
      done
    done
  done
done
echo "identical: $runs simulations (reports and per-request files) in $out"
