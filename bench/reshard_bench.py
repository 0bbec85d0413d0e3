#!/usr/bin/env python3
"""Live re-sharding under load: what workers see and what moves.

    bench/reshard_bench.py [--cluster bazel-bin/deploy/local/cluster] [--runs 2]
        [--workers 4] [--steps 24] [--reshard_at 8:3,16:2] [--mode near-lossless]
        [--chunk_bytes 262144] [--trigger admin] [FILE.npy ...]

Without files, uses digits_cnn_step200.npy and text_gpt_step150.npy from
$GCOMP_GRADIENTS_DIR. Each run is one launcher job (2 shards, re-sharded while W workers
train; the launcher also runs the same job on fixed shards and checks every result
against it). Prints, per re-shard: the switch step, the time workers spent in that step
(median and slowest worker) next to the median step before the first and after the last
switch, and chunks and bytes moved against the chunks in the new map.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*")
    ap.add_argument("--cluster", default="bazel-bin/deploy/local/cluster")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--reshard_at", default="8:3,16:2")
    ap.add_argument("--mode", default="near-lossless")
    ap.add_argument("--chunk_bytes", type=int, default=262144)
    ap.add_argument("--trigger", default="admin", choices=["admin", "file"])
    args = ap.parse_args()
    files = args.files
    if not files:
        d = os.environ.get("GCOMP_GRADIENTS_DIR", "")
        files = [os.path.join(d, f) for f in ("digits_cnn_step200.npy", "text_gpt_step150.npy")]
        if not d or not all(os.path.exists(f) for f in files):
            sys.exit("reshard_bench: give .npy files or set GCOMP_GRADIENTS_DIR")
    for run in range(1, args.runs + 1):
        cmd = [args.cluster, "--shards", "2", "--workers", str(args.workers), "--steps", str(args.steps),
               "--gradients", ",".join(files), "--mode", args.mode, "--chunk_bytes", str(args.chunk_bytes),
               "--reshard_at", args.reshard_at, "--reshard_trigger", args.trigger, "--keep_logs",
               "--progress", "never"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        line = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else "{}"
        result = json.loads(line)
        logs = re.search(r"logs in (\S+)", p.stderr)
        if p.returncode != 0 or not logs:
            sys.exit(f"reshard_bench: run {run} failed (exit {p.returncode}): {line}\n{p.stderr[-2000:]}")
        step_ms = []
        for w in range(args.workers):
            with open(os.path.join(logs.group(1), f"worker{w}.json")) as f:
                step_ms.append(json.loads(f.read().strip().splitlines()[-1])["step_ms"])
        subprocess.run(["rm", "-rf", logs.group(1)], check=False)
        switches = [r["switch_step"] for r in result["reshards"]]

        def steps_ms(steps):
            return [step_ms[w][s] for w in range(args.workers) for s in steps]

        before = statistics.median(steps_ms(range(1, switches[0] - 1)))
        after = statistics.median(steps_ms(range(switches[-1] + 1, args.steps)))
        print(f"run {run}: W={args.workers} {args.mode} chunk {args.chunk_bytes} B, "
              f"identical_to_fixed={result['identical_to_fixed']}, "
              f"step median {before:.1f} ms before the first switch, {after:.1f} ms after the last")
        for r in result["reshards"]:
            t = r["switch_step"]
            at = [step_ms[w][t] for w in range(args.workers)]
            print(f"  {r['from_shards']} -> {r['to_shards']} shards at step {t}: workers' step {t} "
                  f"{statistics.median(at):.1f} ms median, {max(at):.1f} ms slowest "
                  f"(+{max(at) - before:.1f} ms over the median step); chunks moved "
                  f"{r['chunks_moved']} of {r['chunks_total']} ({100.0 * r['chunks_moved'] / r['chunks_total']:.0f}%), "
                  f"{r['bytes_moved'] / 1e6:.2f} MB; shard switch-to-serving {r['pause_ms']:.1f} ms")


if __name__ == "__main__":
    main()
