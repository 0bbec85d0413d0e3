#!/usr/bin/env python3
"""Times the gcomp CLI as whole processes against zstd, in the same run.

    bench/cli_bench.py [--gcomp bazel-bin/gcomp] [--runs 15] [--mode near-lossless] FILE.npy...

For each file, gcomp compress/decompress and `zstd -1 -T1` / `zstd -d -T1` run in turn
(A B A B ...), each run a fresh process reading and writing files in a temporary folder
(page cache warm after the first round, which is not counted). Prints the median wall
time of each and the ratio, and checks that `gcomp decompress` gives back the input's
shape (and, in lossless mode, its bytes).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def timed(cmd):
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - start


def npy_header_bytes(b):
    """The size of a .npy file's header (magic, version, length, dict)."""
    if b[6] == 1:
        return 10 + int.from_bytes(b[8:10], "little")
    return 12 + int.from_bytes(b[8:12], "little")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gcomp", default="bazel-bin/gcomp")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--mode", default="near-lossless", choices=["lossless", "near-lossless"])
    parser.add_argument("--threads", type=int, default=0, help="gcomp --threads (0: all)")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    if not os.access(args.gcomp, os.X_OK):
        sys.exit(f"cli_bench: {args.gcomp} is not an executable (bazel build //:gcomp)")
    if shutil.which("zstd") is None:
        sys.exit("cli_bench: zstd is not installed (apt-get install zstd)")
    threads = ["--threads", str(args.threads)] if args.threads > 0 else []
    print(f"runs {args.runs} (median wall seconds, whole processes), gcomp --mode {args.mode}"
          f" {' '.join(threads)}; zstd -1 -T1")
    print("| file | MB | gcomp compress s | zstd -1 s | gcomp / zstd | gcomp decompress s "
          "| zstd -d s | gcomp / zstd | gcomp size / zstd size |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for path in args.files:
            gcz, npy = os.path.join(tmp, "x.gcz"), os.path.join(tmp, "x.npy")
            zst, raw = os.path.join(tmp, "x.zst"), os.path.join(tmp, "x.raw")
            gc = [args.gcomp, "compress", "--mode", args.mode, *threads, path, gcz]
            gd = [args.gcomp, "decompress", *threads, gcz, npy]
            zc = ["zstd", "-q", "-f", "-1", "-T1", path, "-o", zst]
            zd = ["zstd", "-q", "-f", "-d", "-T1", zst, "-o", raw]
            times = {name: [] for name in ("gc", "zc", "gd", "zd")}
            for run in range(args.runs + 1):
                for name, cmd in (("gc", gc), ("zc", zc), ("gd", gd), ("zd", zd)):
                    t = timed(cmd)
                    if run > 0:
                        times[name].append(t)
            with open(path, "rb") as f_in, open(npy, "rb") as f_out:
                original, decoded = f_in.read(), f_out.read()
            if len(original) != len(decoded):
                sys.exit(f"cli_bench: {path}: decompressed size {len(decoded)} != {len(original)}")
            data = len(original) - npy_header_bytes(original)
            if args.mode == "lossless" and original[-data:] != decoded[-data:]:
                sys.exit(f"cli_bench: {path}: lossless round trip changed the data")
            med = {k: statistics.median(v) for k, v in times.items()}
            print(f"| {os.path.basename(path)} | {os.path.getsize(path) / 1e6:.1f} "
                  f"| {med['gc']:.3f} | {med['zc']:.3f} | {med['gc'] / med['zc']:.2f}x "
                  f"| {med['gd']:.3f} | {med['zd']:.3f} | {med['gd'] / med['zd']:.2f}x "
                  f"| {os.path.getsize(gcz) / os.path.getsize(zst):.3f} |")


if __name__ == "__main__":
    main()
