"""Train a small transformer on allocview's caching allocator, attachable live.

    cargo build --release -p allocview-pluggable --features cuda
    ALLOCVIEW_ADDR=unix:/tmp/allocview-train.sock python3 examples/torch_train.py &
    allocview --attach unix:/tmp/allocview-train.sock

Set-up is the three lines under "allocview" below: load the library, wrap it in PyTorch's
CUDAPluggableAllocator, and make it the current allocator before the first CUDA allocation.
With --pytorch-allocator the same loop runs on PyTorch's own allocator and records a snapshot
(torch.cuda.memory._record_memory_history / _dump_snapshot) for `allocview replay`.
"""

import argparse
import os
import pathlib

import torch
import torch.nn as nn


def library_path() -> str:
    here = pathlib.Path(__file__).resolve().parent.parent
    default = here / "target" / "release" / "liballocview_pluggable.so"
    return os.environ.get("ALLOCVIEW_LIB", str(default))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--pytorch-allocator", action="store_true", help="use PyTorch's own allocator")
    p.add_argument("--snapshot", default=None, help="with --pytorch-allocator: dump a snapshot here")
    p.add_argument("--oom", action="store_true", help="grow the batch every step until the GPU runs out")
    args = p.parse_args()

    if not args.pytorch_allocator:
        # allocview: route every CUDA allocation through allocview's caching allocator.
        alloc = torch.cuda.memory.CUDAPluggableAllocator(library_path(), "allocview_malloc", "allocview_free")
        torch.cuda.memory.change_current_allocator(alloc)
    elif args.snapshot:
        torch.cuda.memory._record_memory_history(max_entries=200_000)

    dev = torch.device("cuda")
    layer = nn.TransformerEncoderLayer(args.width, nhead=8, dim_feedforward=4 * args.width, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=args.layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    side = torch.cuda.Stream()  # a second stream: data "loading" whose buffers the main stream uses

    batch = args.batch
    try:
        for step in range(args.steps):
            with torch.cuda.stream(side):
                x = torch.randn(batch, args.seq, args.width, device=dev)
            torch.cuda.current_stream().wait_stream(side)
            x.record_stream(torch.cuda.current_stream())
            out = model(x)
            loss = out.float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step % 50 == 0:
                # A pluggable allocator has no memory_stats() in PyTorch: allocview shows them.
                mem = f" allocated {torch.cuda.memory_allocated() / 2**20:.1f} MiB" if args.pytorch_allocator else ""
                print(f"step {step} loss {loss.item():.4f}{mem}", flush=True)
            if args.oom:
                batch = int(batch * 1.5) + 1
    except torch.OutOfMemoryError as e:
        print(f"OOM at batch {batch}: {str(e).splitlines()[0]}", flush=True)
    finally:
        torch.cuda.synchronize()
        if args.pytorch_allocator and args.snapshot:
            torch.cuda.memory._dump_snapshot(args.snapshot)
            print(f"snapshot written to {args.snapshot}")


if __name__ == "__main__":
    main()
