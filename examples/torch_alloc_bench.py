"""Cached allocation + free through PyTorch, on its own allocator or on allocview's.

    python3 examples/torch_alloc_bench.py --allocator pytorch
    python3 examples/torch_alloc_bench.py --allocator allocview   # loads liballocview_pluggable.so

Run both (a process can only pick its allocator once) and compare the medians: each is
`torch.empty(n, dtype=torch.uint8)` then its release, for a fixed list of sizes that are
cached after the warm-up, so the device is never called inside the timed loop.
"""

import argparse
import os
import pathlib
import statistics
import time

import torch

SIZES = [512, 4096, 65536, 1 << 20, 3 << 20, 12 << 20, 24 << 20]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--allocator", choices=["pytorch", "allocview"], required=True)
    p.add_argument("--rounds", type=int, default=20000)
    args = p.parse_args()
    if args.allocator == "allocview":
        here = pathlib.Path(__file__).resolve().parent.parent
        lib = os.environ.get("ALLOCVIEW_LIB", str(here / "target" / "release" / "liballocview_pluggable.so"))
        alloc = torch.cuda.memory.CUDAPluggableAllocator(lib, "allocview_malloc", "allocview_free")
        torch.cuda.memory.change_current_allocator(alloc)
    dev = torch.device("cuda")
    for n in SIZES:  # warm the cache
        torch.empty(n, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    batches = []
    per_batch = len(SIZES) * 100
    for _ in range(max(1, args.rounds // 100)):
        t0 = time.perf_counter_ns()
        for _ in range(100):
            for n in SIZES:
                t = torch.empty(n, dtype=torch.uint8, device=dev)
                del t
        batches.append((time.perf_counter_ns() - t0) / per_batch)
    print(f"{args.allocator}: median {statistics.median(batches):.0f} ns per torch.empty + free "
          f"({len(batches)} batches of {per_batch})")


if __name__ == "__main__":
    main()
