"""Drives liballocview_pluggable.so through its C interface with ctypes, as PyTorch's
CUDAPluggableAllocator would (same symbols, same signatures). Run by tests/c_abi.rs:

    python3 c_abi.py LIBRARY MODE

MODE is one of:
  sim       several sizes on two streams, stats checked against PyTorch's rounding, frees,
            a null free, a double free, empty_cache, bad arguments (ALLOCVIEW_BACKEND=sim)
  oom       an allocation larger than the tiny simulated device returns null, the allocator
            still works afterwards, the agent writes an OOM dump (ALLOCVIEW_SIM_MEMORY small)
  default   the default (CUDA) backend: on a machine without a GPU malloc returns null; the
            reason goes to stderr once (the Rust side counts the lines)
  fake-cuda the CUDA backend over the stand-in libcuda of alloc/tests/cuda_backend (host memory
            behind device addresses: the script writes through the pointers, which would crash
            on a real GPU), with or without expandable segments
  attach    allocates a known set, prints READY, then keeps allocating and freeing until stdin
            closes (the Rust side attaches meanwhile)

Exits non-zero with a message on the first failed check.
"""

import ctypes
import json
import os
import sys
import time

MIN_BLOCK_SIZE = 512  # PyTorch's kMinBlockSize: every request rounds up to a multiple of it
STREAM_A = 0  # the default stream
STREAM_B = 0x7F00_1234  # any other cudaStream_t value
MiB = 1 << 20


def load(path):
    lib = ctypes.CDLL(path)
    lib.allocview_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.allocview_malloc.restype = ctypes.c_void_p
    lib.allocview_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.allocview_free.restype = None
    lib.allocview_empty_cache.argtypes = []
    lib.allocview_empty_cache.restype = None
    lib.allocview_memory_stats_json.argtypes = [ctypes.c_int]
    lib.allocview_memory_stats_json.restype = ctypes.c_void_p  # a pointer we must free
    lib.allocview_string_free.argtypes = [ctypes.c_void_p]
    lib.allocview_string_free.restype = None
    return lib


def stats(lib, device=0):
    p = lib.allocview_memory_stats_json(device)
    if not p:
        return None
    try:
        return json.loads(ctypes.string_at(p).decode())
    finally:
        lib.allocview_string_free(p)


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr, flush=True)
        sys.exit(1)


def rounded(size):
    """PyTorch's round_size with default settings."""
    return max(MIN_BLOCK_SIZE, -(-size // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE)


def mode_sim(lib):
    # 24 MiB fills its segment exactly: a larger request whose segment left a remainder of 1 MiB
    # or less would keep it unsplit (PyTorch splits large blocks only above 1 MiB), and count it.
    sizes = [1, 511, 512, 513, 4096, 100_000, MiB, 3 * MiB, 24 * MiB]
    live = []  # (ptr, size, stream)
    for i, size in enumerate(sizes):
        stream = STREAM_A if i % 2 == 0 else STREAM_B
        p = lib.allocview_malloc(size, 0, stream)
        check(p, f"malloc({size}) on stream {stream:#x} returned null")
        check(p % MIN_BLOCK_SIZE == 0, f"malloc({size}) = {p:#x} is not {MIN_BLOCK_SIZE}-aligned")
        live.append((p, size, stream))
    check(len({p for p, _, _ in live}) == len(live), "malloc returned the same pointer twice")

    s = stats(lib)
    check(s is not None, "memory_stats_json(0) returned null")
    want = sum(rounded(size) for size in sizes)
    check(s["allocated_bytes.all.current"] == want,
          f"allocated_bytes.all.current = {s['allocated_bytes.all.current']}, want {want}")
    check(s["allocation.all.current"] == len(sizes), f"allocation.all.current = {s['allocation.all.current']}")
    check(s["requested_bytes.all.current"] == sum(sizes), f"requested_bytes = {s['requested_bytes.all.current']}")
    check(s["reserved_bytes.all.current"] >= want, "reserved < allocated")
    small = sum(rounded(size) for size in sizes if rounded(size) <= MiB)
    check(s["allocated_bytes.small_pool.current"] == small,
          f"small pool allocated = {s['allocated_bytes.small_pool.current']}, want {small}")

    # Zero bytes: no memory, null, and not a failure. Negative: null.
    check(not lib.allocview_malloc(0, 0, STREAM_A), "malloc(0) returned memory")
    check(not lib.allocview_malloc(-4096, 0, STREAM_A), "malloc(-4096) returned memory")
    check(not lib.allocview_malloc(4096, 9, STREAM_A), "malloc on device 9 (of 1) returned memory")
    check(stats(lib, 9) is None, "memory_stats_json(9) answered for a device that does not exist")

    lib.allocview_free(None, 0, 0, None)  # a null free does nothing
    for p, size, stream in live:
        lib.allocview_free(p, size, 0, stream)
    lib.allocview_free(live[0][0], live[0][1], 0, live[0][2])  # a double free is reported, not fatal

    s = stats(lib)
    check(s["allocated_bytes.all.current"] == 0, f"allocated after frees = {s['allocated_bytes.all.current']}")
    check(s["allocation.all.current"] == 0, "allocations left after frees")
    check(s["allocated_bytes.all.peak"] == want, f"peak = {s['allocated_bytes.all.peak']}, want {want}")
    check(s["reserved_bytes.all.current"] > 0, "the cache kept nothing after frees")

    # The cache serves a repeat of the same request on the same stream without a new segment.
    segments = s["segment.all.current"]
    p = lib.allocview_malloc(3 * MiB, 0, STREAM_B)
    check(p, "malloc from the cache returned null")
    check(stats(lib)["segment.all.current"] == segments, "a cached block needed a new segment")
    lib.allocview_free(p, 3 * MiB, 0, STREAM_B)

    lib.allocview_empty_cache()
    s = stats(lib)
    check(s["reserved_bytes.all.current"] == 0, f"reserved after empty_cache = {s['reserved_bytes.all.current']}")
    check(s["num_ooms"] == 0, "an OOM was counted")
    print("sim: ok", flush=True)


def is_dump(name):
    """The agent's dump files: oom-NNNN-pidPID.{pickle,json} (never its temporary files)."""
    return name.startswith("oom-") and name.endswith((".json", ".pickle"))


def mode_oom(lib):
    capacity = int(os.environ["ALLOCVIEW_SIM_MEMORY"])
    p = lib.allocview_malloc(capacity // 2, 0, STREAM_A)
    check(p, "the first half of the device was refused")
    q = lib.allocview_malloc(capacity * 2, 0, STREAM_A)
    check(not q, "an allocation twice the device's size succeeded")
    q = lib.allocview_malloc(capacity * 2, 0, STREAM_A)
    check(not q, "a second oversized allocation succeeded")
    s = stats(lib)
    check(s["num_ooms"] == 2, f"num_ooms = {s['num_ooms']}, want 2")
    small = lib.allocview_malloc(4096, 0, STREAM_A)
    check(small, "the allocator did not recover after an OOM")
    lib.allocview_free(small, 4096, 0, STREAM_A)
    lib.allocview_free(p, capacity // 2, 0, STREAM_A)
    check(stats(lib)["allocated_bytes.all.current"] == 0, "memory left allocated")

    dump_dir = os.environ["ALLOCVIEW_DUMP_DIR"]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if os.path.isdir(dump_dir) and any(is_dump(n) for n in os.listdir(dump_dir)):
            break
        time.sleep(0.05)
    dumps = sorted(n for n in os.listdir(dump_dir) if is_dump(n)) if os.path.isdir(dump_dir) else []
    check(dumps, f"no OOM dump appeared in {dump_dir}")
    print(f"oom: ok ({len(dumps)} dump file(s): {', '.join(dumps)})", flush=True)


def mode_default(lib):
    p1 = lib.allocview_malloc(1 << 20, 0, STREAM_A)
    p2 = lib.allocview_malloc(1 << 20, 0, STREAM_A)
    if p1 and p2:
        # A real GPU answered: give the memory back.
        lib.allocview_free(p1, 1 << 20, 0, STREAM_A)
        lib.allocview_free(p2, 1 << 20, 0, STREAM_A)
        print("default: GPU", flush=True)
        return
    check(not p1 and not p2, "one of two identical allocations failed")
    print("default: null", flush=True)


def mode_fake_cuda(lib):
    sizes = [512, 4096, 100_000, MiB, 3 * MiB, 24 * MiB]
    live = []
    for size in sizes:
        p = lib.allocview_malloc(size, 0, STREAM_A)
        check(p, f"malloc({size}) returned null on the stand-in driver")
        ctypes.memset(p, 0x5A, size)  # the memory behind the pointer is mapped and writable
        check(ctypes.string_at(p + size - 1, 1) == b"\x5a", f"malloc({size}): memory did not hold a write")
        live.append((p, size))
    s = stats(lib)
    want = sum(rounded(size) for size in sizes)
    check(s["allocated_bytes.all.current"] == want,
          f"allocated_bytes.all.current = {s['allocated_bytes.all.current']}, want {want}")
    check(s["num_device_alloc"] > 0, "no device allocation was made")
    for p, size in live:
        lib.allocview_free(p, size, 0, STREAM_A)
    lib.allocview_empty_cache()
    s = stats(lib)
    check(s["allocated_bytes.all.current"] == 0, "memory left allocated")
    check(s["reserved_bytes.all.current"] == 0, f"reserved after empty_cache = {s['reserved_bytes.all.current']}")
    print(f"fake-cuda: ok ({s['num_device_alloc']} device allocations)", flush=True)


def mode_attach(lib):
    held = [
        (lib.allocview_malloc(MiB, 0, STREAM_A), MiB, STREAM_A),
        (lib.allocview_malloc(MiB, 0, STREAM_A), MiB, STREAM_A),
        (lib.allocview_malloc(5 * MiB, 0, STREAM_B), 5 * MiB, STREAM_B),
    ]
    check(all(p for p, _, _ in held), "an allocation failed")
    print("READY", flush=True)
    # Keep the allocator busy until the test closes our stdin (or a minute passes).
    os.set_blocking(sys.stdin.fileno(), False)
    deadline = time.monotonic() + 60
    n = 0
    while time.monotonic() < deadline:
        try:
            if sys.stdin.buffer.read() == b"":
                break  # EOF: the test is done
        except (BlockingIOError, TypeError):
            pass  # nothing to read yet
        size = 4096 * (1 + n % 7)
        p = lib.allocview_malloc(size, 0, STREAM_A)
        check(p, "malloc failed while attached")
        lib.allocview_free(p, size, 0, STREAM_A)
        n += 1
        time.sleep(0.01)
    for p, size, stream in held:
        lib.allocview_free(p, size, 0, stream)
    print(f"attach: ok ({n} cycles)", flush=True)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    lib = load(sys.argv[1])
    modes = {
        "sim": mode_sim,
        "oom": mode_oom,
        "default": mode_default,
        "fake-cuda": mode_fake_cuda,
        "attach": mode_attach,
    }
    modes[sys.argv[2]](lib)


if __name__ == "__main__":
    main()
