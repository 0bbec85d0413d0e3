#!/usr/bin/python3
"""A model of one training step of the service, calibrated here, checked against measured
runs, and used to predict other machines and links (docs/BENCHMARKS.md, "A model of the
step").

    bench/ps_bench.sh FILES STEPS 10gbit 2> runs.jsonl      # measured runs to check against
    bench/step_model.py --gradients FILES --measured runs.jsonl

Terms, per step, for W workers and S shards, G raw gradient bytes per worker, r the wire
ratio (1 for `none`):
  worker CPU   = codec (encode G + decode G, one thread, `gcomp bench`) + service (the rest
                 of a worker's measured CPU: gRPC, protobuf, copies, checksums)
  shard CPU    = measured per shard (W pushes decoded and summed, one result encoded, W
                 replies, and the service around them)
  wire         = bytes per direction over a link / rate, up and down (the runs below show
                 little overlap between the two on a synchronous step)
Calibration: per-process CPU seconds of two loopback runs of the local launcher (W = 4,
S = 2, 1 MiB chunks) of different lengths, differenced so start-up cancels out.

On one machine with C cores shared by every process (worker 0's reference checks, run
between its timed steps, left out): step = max(CPU of all processes / C,
wire). With a core (and a NIC) per process: step = max(worker CPU, shard CPU, wire through
the busiest NIC), where a shard's NIC carries W G / (S r) each way and a worker's G / r.
Both are pipelined bounds: they assume the chunks keep every stage busy.
"""
import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(ROOT, "bazel-bin", "deploy", "local", "cluster")
GCOMP = os.path.join(ROOT, "bazel-bin", "gcomp")


def codec_speeds(files):
    """Near-lossless one-thread encode and decode GB/s over the files (size-weighted time)."""
    enc_s = dec_s = size = 0.0
    for f in files:
        out = subprocess.run([GCOMP, "bench", "--repeats", "3", f], capture_output=True,
                             text=True, check=True).stdout
        row = [l for l in out.splitlines() if l.startswith("| gcomp near-lossless")][0]
        cells = [c.strip() for c in row.strip("|").split("|")]
        enc, dec = float(cells[2]), float(cells[3])
        n = os.path.getsize(f)
        enc_s += n / enc
        dec_s += n / dec
        size += n
    return size / enc_s, size / dec_s


def machine_busy_s():
    """CPU seconds the whole machine has spent busy (every state but idle and iowait), from
    /proc/stat: the kernel's work for the processes (loopback TCP in softirq context) is
    not all charged to them."""
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]
    return busy / os.sysconf("SC_CLK_TCK")


def launcher(files, mode, steps, workers, shards):
    busy = machine_busy_s()
    out = subprocess.run([CLUSTER, "--shards", str(shards), "--workers", str(workers),
                          "--steps", str(steps), "--mode", mode, "--gradients", ",".join(files)],
                         capture_output=True, text=True, timeout=1800)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        sys.exit("step_model: the launcher failed (%s): %s" % (mode, out.stderr[-2000:]))
    r = json.loads(lines[-1])
    if not r["ok"]:
        sys.exit("step_model: %s run not ok: %s" % (mode, r["error"]))
    r["machine_busy_s"] = machine_busy_s() - busy
    return r


def per_step_cpu(short, long):
    """Per-step CPU seconds of a worker (median of workers 1.., worker 0 also checks every
    result) and a shard (mean), differenced between two runs."""
    steps = long["steps"] - short["steps"]
    w = sorted((b - a) / steps for a, b in zip(short["worker_cpu_s"][1:],
                                                long["worker_cpu_s"][1:]))
    s = [(b - a) / steps for a, b in zip(short["shard_cpu_s"], long["shard_cpu_s"])]
    return w[len(w) // 2], sum(s) / len(s)


def rate_of(label):
    """Bits per second from a run label such as '10gbit veth'; None for loopback."""
    m = re.match(r"\s*([\d.]+)\s*([kmg])bit", label.lower())
    if not m:
        return None
    return float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


class Model:
    def __init__(self, raw_bytes, terms, workers, shards):
        self.g = raw_bytes  # per worker per step
        self.terms = terms  # mode -> dict(ratio, worker_codec_s, worker_service_s, shard_s)
        self.w, self.s = workers, shards

    def worker_s(self, mode, gpu_gbps=None):
        t = self.terms[mode]
        codec = t["worker_codec_s"]
        if gpu_gbps and mode != "none":
            codec = 2 * self.g / (gpu_gbps * 1e9)
        return codec + t["worker_service_s"]

    def shared_machine(self, mode, cores, rate_bps):
        """One machine, `cores` cores for every process, the shards behind one link."""
        t = self.terms[mode]
        # Worker 0's reference checks are left out: the worker runs them between its timed
        # steps (deferred, gcomp_worker --defer_checks_bytes), and no training job has them.
        cpu = (self.w * self.worker_s(mode) + self.s * t["shard_s"] + t["uncharged_s"]) / cores
        wire = 0.0
        if rate_bps:
            per_direction = self.w * self.g / t["ratio"]
            wire = 2 * per_direction * 8 / rate_bps
        return max(cpu, wire), cpu, wire

    def core_per_process(self, mode, rate_bps, gpu_gbps=None, shard_cores=1):
        """A machine per process: each worker one core, each shard `shard_cores` (its calls
        run in parallel on gRPC's threads, so its CPU time divides among them)."""
        t = self.terms[mode]
        shard_nic = self.w * self.g / (self.s * t["ratio"])
        worker_nic = self.g / t["ratio"]
        wire = 2 * max(shard_nic, worker_nic) * 8 / rate_bps
        return max(self.worker_s(mode, gpu_gbps), t["shard_s"] / shard_cores, wire)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gradients", required=True, help="comma-separated .npy files (one step)")
    p.add_argument("--steps", type=int, default=60, help="steps of the longer calibration run")
    p.add_argument("--measured", help="JSON lines of the launcher (bench/ps_bench.sh's stderr) "
                                      "to check the model against")
    p.add_argument("--gpu_gbps", type=float, default=200.0,
                   help="the GPU codec's encode/decode speed for the predictions (GB/s)")
    args = p.parse_args()
    files = args.gradients.split(",")
    for f in files:
        if not os.path.isfile(f):
            sys.exit("step_model: no gradient file %s" % f)
    for b in (CLUSTER, GCOMP):
        if not os.access(b, os.X_OK):
            sys.exit("step_model: %s is not built (bazel build //deploy/local:cluster "
                     "//:gcomp)" % b)
    workers, shards = 4, 2
    enc, dec = codec_speeds(files)
    terms, raw = {}, None
    for mode in ("none", "near-lossless"):
        short = launcher(files, mode, max(2, args.steps // 6), workers, shards)
        long = launcher(files, mode, args.steps, workers, shards)
        raw = long["raw_bytes"] / (2 * long["steps"] * workers)
        w, s = per_step_cpu(short, long)
        codec = 0.0 if mode == "none" else raw / (enc * 1e9) + raw / (dec * 1e9)
        # Machine CPU beyond the processes' own (worker 0's reference checks included),
        # per step, differenced like theirs.
        steps = long["steps"] - short["steps"]
        charged = sum(long["worker_cpu_s"] + long["shard_cpu_s"]) - sum(
            short["worker_cpu_s"] + short["shard_cpu_s"])
        kernel = (long["machine_busy_s"] - short["machine_busy_s"] - charged) / steps
        checks = (charged / steps) - workers * w - shards * s
        terms[mode] = {"ratio": long["ratio"], "worker_codec_s": codec,
                       "worker_service_s": w - codec, "shard_s": s,
                       "uncharged_s": max(0.0, kernel), "checks_s": max(0.0, checks),
                       "loopback_step_s": long["step_ms_p50"] / 1e3}
    model = Model(raw, terms, workers, shards)
    cores = os.cpu_count()

    print("gradient %.2f MB per worker per step; codec 1 thread: encode %.2f GB/s, decode "
          "%.2f GB/s; %d cores" % (raw / 1e6, enc, dec, cores))
    print()
    print("| mode | wire ratio | worker codec ms | worker service ms | shard ms | "
          "worker 0 checks ms | not charged to the processes ms | model on this machine "
          "(loopback) ms | measured loopback ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for mode, t in terms.items():
        predicted = model.shared_machine(mode, cores, None)[0]
        print("| %s | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |" % (
            mode, t["ratio"], t["worker_codec_s"] * 1e3, t["worker_service_s"] * 1e3,
            t["shard_s"] * 1e3, t["checks_s"] * 1e3, t["uncharged_s"] * 1e3,
            predicted * 1e3, t["loopback_step_s"] * 1e3))

    if args.measured:
        print()
        print("| link | mode | measured step ms (p50) | model ms | model / measured | "
              "CPU term ms | wire term ms |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for line in open(args.measured):
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if (r.get("workers"), r.get("shards")) != (workers, shards):
                continue
            rate = rate_of(r.get("label", ""))
            step, cpu, wire = model.shared_machine(r["mode"], cores, rate)
            print("| %s | %s | %.1f | %.1f | %.2f | %.1f | %.1f |" % (
                r.get("label") or "loopback", r["mode"], r["step_ms_p50"], step * 1e3,
                step * 1e3 / r["step_ms_p50"], cpu * 1e3, wire * 1e3))

    print()
    print("Predicted step ms, W = %d, S = %d, this gradient, a core and a NIC per process "
          "(GPU codec at %.0f GB/s):" % (workers, shards, args.gpu_gbps))
    print()
    print("| link | shard cores | none | near-lossless, CPU codec | near-lossless, GPU codec "
          "| near-lossless / none (CPU codec) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for gbit in (1, 10, 25, 100):
        for k in (1, 4):
            rate = gbit * 1e9
            none = model.core_per_process("none", rate, shard_cores=k)
            cpu = model.core_per_process("near-lossless", rate, shard_cores=k)
            gpu = model.core_per_process("near-lossless", rate, args.gpu_gbps, shard_cores=k)
            print("| %d Gbit/s | %d | %.1f | %.1f | %.1f | %.2fx |" % (
                gbit, k, none * 1e3, cpu * 1e3, gpu * 1e3, cpu / none))


if __name__ == "__main__":
    main()
