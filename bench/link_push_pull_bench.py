#!/usr/bin/python3
"""Push-pull alone on emulated links: W gcomp_worker processes replay one gradient file
through S gcomp_server shards, every process a host of its own on train_bench.py's
EmulatedNetwork (a namespace and a tbf-limited veth, the same rate both ways). No model and
no torch, so the numbers are the client's and the links', not the training loop's.

    sudo /usr/bin/python3 bench/link_push_pull_bench.py --rate 100mbit --mb 67 --steps 6

Prints one JSON line per run: each worker's step times (ms), the median step without step
0, and each worker's veth bytes sent and received per step with the rate they imply.
--root names the checkout whose bazel-bin/{server,worker} binaries run (default: this
one), so two builds can be compared on the same links. Needs root.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import train_bench  # noqa: E402  (EmulatedNetwork, parse_rate, _listening)
from gcomp import cluster  # noqa: E402


def _counters(ns):
    out = subprocess.run(["ip", "netns", "exec", ns, "cat",
                          "/sys/class/net/eth0/statistics/tx_bytes",
                          "/sys/class/net/eth0/statistics/rx_bytes"],
                         check=True, capture_output=True, text=True).stdout.split()
    return int(out[0]), int(out[1])


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--mb", type=float, default=67, help="tensor size in MB (float32)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--mode", default="none", choices=("none", "lossless", "near-lossless"))
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="a cluster config field (docs/SERVICE.md), VALUE as JSON; repeatable")
    p.add_argument("--root", default=os.path.dirname(HERE),
                   help="checkout whose bazel-bin binaries run")
    p.add_argument("--label", default="")
    args = p.parse_args()
    server = os.path.join(args.root, "bazel-bin", "server", "gcomp_server")
    worker = os.path.join(args.root, "bazel-bin", "worker", "gcomp_worker")
    for b in (server, worker):
        if not os.access(b, os.X_OK):
            raise SystemExit("error: no %s (bazel build //server:gcomp_server "
                             "//worker:gcomp_worker)" % b)
    import numpy as np
    # SIGTERM ends the run through the finally block below (processes and namespaces).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    net = train_bench.EmulatedNetwork(train_bench.parse_rate(args.rate))
    procs = []
    try:
        hosts = [net.add_host() for _ in range(args.workers + args.shards)]
        with tempfile.TemporaryDirectory(prefix="link-bench-") as tmp:
            os.chmod(tmp, 0o755)
            grad = os.path.join(tmp, "g.npy")
            rng = np.random.default_rng(0)
            np.save(grad, (rng.standard_normal(int(args.mb * 1e6 / 4)) * 1e-3).astype(np.float32))
            addresses = ["%s:7000" % hosts[args.workers + k][1] for k in range(args.shards)]
            fields = {}
            for item in args.set:
                k, _, v = item.partition("=")
                fields[k] = json.loads(v)
            config = cluster.cluster_config(addresses, args.workers, args.mode, **fields)
            path = os.path.join(tmp, "cluster.json")
            with open(path, "w") as f:
                json.dump(config, f)
            for k in range(args.shards):
                log = open(os.path.join(tmp, "shard%d.log" % k), "w")
                procs.append(subprocess.Popen(
                    ["ip", "netns", "exec", hosts[args.workers + k][0], server, "--config", path,
                     "--shard", str(k), "--log_level", "warn", "--metrics_address", "none"],
                    stdout=log, stderr=log))
            deadline = time.time() + 30
            for s in procs:
                while not train_bench._listening(s.pid, 7000):
                    if s.poll() is not None or time.time() > deadline:
                        raise SystemExit("error: a shard did not start (%s)" % tmp)
                    time.sleep(0.05)
            before = [_counters(hosts[w][0]) for w in range(args.workers)]
            workers = [subprocess.Popen(
                ["ip", "netns", "exec", hosts[w][0], worker, "--config", path, "--worker",
                 str(w), "--gradients", grad, "--steps", str(args.steps), "--verify=false",
                 "--log_level", "warn"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for w in range(args.workers)]
            outs = [w.communicate(timeout=1200) for w in workers]
            after = [_counters(hosts[w][0]) for w in range(args.workers)]
    finally:
        for s in procs:
            s.terminate()
        for s in procs:
            s.wait()
        net.close()
    record = {"label": args.label, "rate": args.rate, "mb": args.mb, "mode": args.mode,
              "workers": args.workers, "shards": args.shards, "steps": args.steps,
              "set": args.set, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    rate_bytes = train_bench.parse_rate(args.rate) / 8
    per_worker = []
    for w, (out, err) in enumerate(outs):
        lines = [l for l in out.splitlines() if l.startswith("{")]
        if workers[w].returncode != 0 or not lines:
            raise SystemExit("error: worker %d failed: %s" % (w, (err or out).strip()[-400:]))
        steps = json.loads(lines[-1])["step_ms"]
        tx = (after[w][0] - before[w][0]) / args.steps
        rx = (after[w][1] - before[w][1]) / args.steps
        per_worker.append({"step_ms": [round(x, 1) for x in steps],
                           "tx_mb_per_step": round(tx / 1e6, 2),
                           "rx_mb_per_step": round(rx / 1e6, 2)})
    steady = [x for pw in per_worker for x in pw["step_ms"][1:]]
    median_s = statistics.median(steady) / 1e3
    record["per_worker"] = per_worker
    record["median_step_s"] = round(median_s, 3)
    up = statistics.mean(pw["tx_mb_per_step"] for pw in per_worker) * 1e6
    down = statistics.mean(pw["rx_mb_per_step"] for pw in per_worker) * 1e6
    # What the link allows: one direction alone (they overlap) and both in turn.
    record["wire_s_larger_direction"] = round(max(up, down) / rate_bytes, 3)
    record["wire_s_both_in_turn"] = round((up + down) / rate_bytes, 3)
    record["down_mb_per_s"] = round(down / median_s / 1e6, 2)
    record["link_mb_per_s"] = round(rate_bytes / 1e6, 2)
    print(json.dumps(record))


if __name__ == "__main__":
    main()
