#!/usr/bin/env bash
# GPU validation (issue 9), run on the device machine (PyTorch with CUDA, no cargo) after
# scripts/gpu/build.sh staged target/gpu-bundle here. Everything it makes goes to $OUT
# (default ./gpu-out): logs, recorded snapshots, replay reports, benchmark figures.
#   bash scripts/gpu/run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
bundle=target/gpu-bundle
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export ALLOCVIEW_LIB="$PWD/$bundle/liballocview_pluggable.so"
av="$PWD/$bundle/allocview"
status=0
step() { echo; echo "== $*"; }
run() { "$@" || { echo "FAILED ($?): $*"; status=1; }; }

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$OUT/gpu.txt"

step "CUDA backend tests and the caching suite on CudaBackend"
for t in "$bundle"/tests/*; do
  run env ALLOCVIEW_CUDA_TESTS=1 "$t" --nocapture --test-threads=1 2>&1 | tee "$OUT/$(basename "$t").log"
done

step "demo on the real GPU"
run "$av" demo --backend cuda --headless --seconds 10 --json | tee "$OUT/demo-cuda.json"

step "PyTorch training on allocview's allocator, attached live"
sock=/tmp/allocview-gpu-$$.sock
ALLOCVIEW_ADDR=unix:$sock python3 examples/torch_train.py --steps 300 > "$OUT/train-allocview.log" 2>&1 &
train=$!
for _ in $(seq 1 60); do [ -S "$sock" ] && break; sleep 1; done
sleep 3  # a few steps in, well before the run ends
run "$av" --attach "unix:$sock" --headless --once --json > "$OUT/attach.json"
wait "$train" || { echo "FAILED: training on allocview's allocator"; status=1; }
tail -5 "$OUT/train-allocview.log"

step "the same loop on PyTorch's allocator, recorded"
run python3 examples/torch_train.py --pytorch-allocator --steps 300 --snapshot "$OUT/default.pickle" > "$OUT/train-default.log" 2>&1
run env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 examples/torch_train.py --pytorch-allocator --steps 300 \
  --snapshot "$OUT/expandable.pickle" > "$OUT/train-expandable.log" 2>&1
run python3 examples/torch_train.py --pytorch-allocator --steps 60 --oom --snapshot "$OUT/oom.pickle" > "$OUT/train-oom.log" 2>&1

step "replay of each recording: fidelity"
for f in default expandable oom; do
  [ -f "$OUT/$f.pickle" ] || continue
  run "$av" replay "$OUT/$f.pickle" --json > "$OUT/replay-$f.json"
  run "$av" replay "$OUT/$f.pickle" | tee "$OUT/replay-$f.txt"
done
[ -f "$OUT/oom.pickle" ] && run "$av" summary "$OUT/oom.pickle" | tee "$OUT/summary-oom.txt"

step "allocation benchmark: allocview (pluggable) vs PyTorch's allocator, same sizes"
run python3 examples/torch_alloc_bench.py --allocator pytorch | tee "$OUT/bench-pytorch.txt"
run python3 examples/torch_alloc_bench.py --allocator allocview | tee "$OUT/bench-allocview.txt"

echo; echo "== done (status $status); outputs in $OUT"
exit $status
