#!/usr/bin/env bash
# Builds everything the GPU validation needs (here, where cargo is) into target/gpu-bundle/,
# which the device machine receives with `carry` and runs with scripts/gpu/run.sh.
#   bash scripts/gpu/build.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=target/gpu-bundle
rm -rf "$out" && mkdir -p "$out/tests"
cargo build --release -p allocview --features cuda
cargo build --release -p allocview-pluggable --features cuda
cp target/release/allocview target/release/liballocview_pluggable.so "$out/"
# Test binaries of the CUDA backend and of the caching suite, built with the CUDA backend in.
cargo test -p allocview-alloc --features cuda --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' \
  | while read -r exe; do
      case "$(basename "$exe")" in
        cuda_backend-*|caching_suite-*) cp "$exe" "$out/tests/$(basename "$exe" | sed 's/-[0-9a-f]*$//')";;
      esac
    done
ls -la "$out" "$out/tests"
