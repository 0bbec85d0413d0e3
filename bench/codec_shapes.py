#!/usr/bin/env python3
"""Codec speed on inputs shaped unlike the usual gradient, against the usual one, same run.

    PYTHONPATH=python:bazel-bin/python bench/codec_shapes.py [--repeats 7] [GRADIENT.npy]

Near-lossless, one thread, best of --repeats. Two tables, each relative to its first row:
- block size: the gradient (default: a seeded normal one of 4 M elements) encoded in blocks
  of 1 MiB down to 1 KiB, as a small `chunk_bytes` or small tensors make them;
- value shapes at 1 MiB blocks: the normal gradient, a constant, values within one binade,
  alternating signs, subnormals, NaN (1 in 10^5, 1%, half), 1% Inf, and the gradient cast
  to float16 as it is and scaled by 64 and 1024.
Each frame is checked to decode to the bound (a miss stops the run).
"""
import argparse
import sys
import time

import numpy as np

from gcomp import codec


def best_of(repeats, fn):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(x, block_bytes, repeats):
    """(ratio, encode MB/s, decode MB/s) of x."""
    frame = codec.encode(x, block_bytes=block_bytes)
    out = np.empty_like(x)
    codec.decode(frame, out)
    finite = np.isfinite(x)
    if not np.array_equal(np.isnan(out), np.isnan(x)) or np.any(
            np.abs(out[finite].astype(np.float64) - x[finite]) >
            np.maximum(2.0 ** -8 * np.abs(x[finite].astype(np.float64)),
                       2.0 ** -16 * np.max(np.abs(x[finite])))):
        sys.exit("codec_shapes: a decoded value is outside the near-lossless bound")
    enc = best_of(repeats, lambda: codec.encode(x, block_bytes=block_bytes))
    dec = best_of(repeats, lambda: codec.decode(frame, out))
    mb = x.nbytes / 1e6
    return x.nbytes / len(frame), mb / enc, mb / dec


def table(title, rows, repeats):
    print("\n%s\n" % title)
    print("| input | ratio | enc MB/s | dec MB/s | enc vs first row | dec vs first row |")
    print("| --- | --- | --- | --- | --- | --- |")
    first = None
    for name, x, block_bytes in rows:
        ratio, enc, dec = measure(x, block_bytes, repeats)
        first = first or (enc, dec)
        print("| %s | %.3f | %.0f | %.0f | %.2fx | %.2fx |"
              % (name, ratio, enc, dec, enc / first[0], dec / first[1]), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gradient", nargs="?", help="a float32 .npy (default: synthetic)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    rng = np.random.default_rng(1)
    n = 4 << 20
    if args.gradient:
        grad = np.load(args.gradient).astype(np.float32, copy=False).ravel()
        name = args.gradient.rsplit("/", 1)[-1]
    else:
        grad = (rng.standard_normal(n) * 1e-3).astype(np.float32)
        name = "normal, sigma 1e-3"
    table("Block size (%s)" % name,
          [("%s, %d KiB blocks" % (name, kib), grad, kib << 10)
           for kib in (1024, 64, 16, 4, 1)], args.repeats)
    m = grad.size
    shapes = [
        (name, grad),
        ("constant 0.3141", np.full(m, 0.3141, np.float32)),
        ("one binade [1, 2)", (1 + rng.uniform(0, 0.99, m)).astype(np.float32)),
        ("alternating +-1.7", np.where(np.arange(m) % 2 == 0, 1.7, -1.7).astype(np.float32)),
        ("subnormals", (rng.standard_normal(m) * 1e-40).astype(np.float32)),
        ("one NaN per 100,000", np.where(rng.uniform(size=m) < 1e-5, np.nan, grad)
         .astype(np.float32)),
        ("1% NaN", np.where(rng.uniform(size=m) < 0.01, np.nan, grad).astype(np.float32)),
        ("half NaN", np.where(rng.uniform(size=m) < 0.5, np.nan, grad).astype(np.float32)),
        ("1% Inf", np.where(rng.uniform(size=m) < 0.01, np.inf, grad).astype(np.float32)),
    ]
    # float16 (MB/s of its 2-byte elements): as cast, f16 subnormals are common and blocks
    # with a largest magnitude under 4 keep exponent field 0; scaled as a loss scale would.
    for scale in (1, 64, 1024):
        shapes.append(("float16, the gradient x %d" % scale, (grad * scale).astype(np.float16)))
    table("Value shapes (1 MiB blocks)", [(s, x, 1 << 20) for s, x in shapes], args.repeats)


if __name__ == "__main__":
    main()
