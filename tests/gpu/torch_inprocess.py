#!/usr/bin/env python3
"""TorchScript called in-process on a GPU: the reference for inferd's PyTorch figures (issue 29).

  torch_inprocess.py <model.pt> <iterations> <batch> [<batch> ...]

For each batch size: the same work an inferd GPU instance does per batch, from host memory to
host memory (the input in pinned memory copied to the device non-blocking, forward() under
inference mode, the output copied back, one synchronize), timed with a host clock after the
synchronize, after 10 warm-up runs (TorchScript's profiling executor optimizes in the first
runs). Prints one line per batch: `batch B p50_ms X items_per_s Y`.
"""

import sys
import time

import torch


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    path, iterations = sys.argv[1], int(sys.argv[2])
    device = torch.device("cuda:0")
    module = torch.jit.load(path, map_location=device).eval()
    stream = torch.cuda.Stream(device)
    for batch in map(int, sys.argv[3:]):
        host = torch.randn(batch, 3, 224, 224).pin_memory()
        times = []
        with torch.inference_mode(), torch.cuda.stream(stream):
            for i in range(iterations + 10):
                t0 = time.perf_counter()
                x = host.to(device, non_blocking=True)
                y = module(x)
                out = torch.empty(y.shape, dtype=y.dtype, pin_memory=True)
                out.copy_(y, non_blocking=True)
                stream.synchronize()
                if i >= 10:
                    times.append(time.perf_counter() - t0)
        times.sort()
        p50 = times[len(times) // 2]
        print(f"batch {batch} p50_ms {p50 * 1e3:.3f} items_per_s {batch * len(times) / sum(times):.1f}",
              flush=True)


if __name__ == "__main__":
    main()
