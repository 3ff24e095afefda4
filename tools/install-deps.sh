#!/usr/bin/env bash
# Installs the Debian packages tandem builds and tests with. Skips apt when all are present.
set -euo pipefail
packages=(
  cmake ninja-build g++ clang libclang-rt-14-dev   # compilers; clang + its runtime for libFuzzer
  libgtest-dev libgmock-dev libbenchmark-dev        # tests and micro-benchmarks
  nlohmann-json3-dev libcli11-dev libfmt-dev        # JSON, command line, formatting
  libpcre2-dev libyaml-cpp-dev python3              # tokenizer regexes; rule files; fixture checker
  python3-jinja2                                    # the chat templates' reference renderer (tests)
  libcpp-httplib-dev pkg-config                     # the HTTP server (found through pkg-config)
  chromium                                          # the server's web page test (headless)
  openmpi-bin libopenmpi-dev                        # ranks over several machines (transport)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Node.js for the server tests (any recent one; a Debian machine gets its own), then their npm
# packages (the official openai client, playwright-core) from the lock file.
if ! command -v node >/dev/null; then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends nodejs npm
fi
tests_server="$(dirname "$0")/../tests/server"
if [[ ! -d $tests_server/node_modules || $tests_server/package-lock.json -nt $tests_server/node_modules ]]; then
  npm ci --prefix "$tests_server" --no-audit --no-fund --loglevel=error
fi
