#!/usr/bin/python3
"""Training on emulated links: gcomp-ps against DDP allreduce and PyTorch's own hooks.

Every worker and every shard is a host of its own: a network namespace with one veth link
to a bridge (in a namespace of its own), rate-limited by tc (tbf) in both directions to
the same rate. Allreduce and parameter-server traffic then pay for the links they really
use. Each row trains the same model from the same seed on the same global batches with the
same optimizer; only the gradient exchange differs:

    ddp             DDP, gloo allreduce, no hook (the baseline every row is divided by)
    fp16            DDP + fp16_compress_hook
    powersgd-R      DDP + powerSGD_hook, matrix_approximation_rank R (1 and 4)
    gcomp-MODE      DDP + gcomp.torch.ps_hook through S gcomp_server shards,
                    MODE in none, lossless, near-lossless, aggressive

    sudo /usr/bin/python3 bench/train_bench.py --model wide-mlp --rates 100mbit,1gbit \
        --workers 2 --shards 2 --steps 12 --repeats 2 --out-dir /tmp/train-bench

Writes <out-dir>/runs.jsonl (one raw record per row and repeat, appended), table.md and
plot.png; prints the table. Needs root (ip netns, tc). The namespaces, links, bridge and
processes it made are removed on exit, also on Ctrl-C or an error.

A new model is one function: `def my_task(args) -> Task` added to MODELS (see `tiny_task`).
"""
import argparse
import atexit
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES = os.path.join(ROOT, "examples")
PYTHONPATH = [os.path.join(ROOT, "python"), os.path.join(ROOT, "bazel-bin", "python")]

DDP_SYSTEMS = ("ddp", "fp16", "powersgd-1", "powersgd-4")
GCOMP_MODES = {  # system -> (codec mode, rel_bits, abs_log2, error feedback)
    "gcomp-none": ("none", 7, -16, False),
    "gcomp-lossless": ("lossless", 7, -16, False),
    "gcomp-near-lossless": ("near-lossless", 7, -16, False),
    # examples/common.py PRESETS["aggressive"]
    "gcomp-aggressive": ("near-lossless", 3, -10, True),
}
SYSTEMS = DDP_SYSTEMS + tuple(GCOMP_MODES)
SUBNET = "10.213.0."


# ---------------------------------------------------------------- models (one function each)

class Task:
    """What a row trains. metric: name of the held-out number evaluate() returns;
    higher_is_better: accuracy (True) or loss (False)."""

    def __init__(self, build_model, make_optimizer, loss, train_batch, evaluate, metric,
                 higher_is_better):
        self.build_model = build_model
        self.make_optimizer = make_optimizer
        self.loss = loss
        self.train_batch = train_batch
        self.evaluate = evaluate
        self.metric = metric
        self.higher_is_better = higher_is_better


def _example_task(task, metric, higher_is_better):
    return Task(task.build_model, task.make_optimizer, task.loss, task.train_batch,
                lambda model: task.evaluate(model)[metric], metric, higher_is_better)


def digits_task(args):
    """examples/train_digits.py: CNN, 1.13 M parameters, scikit-learn's digits."""
    sys.path.insert(0, EXAMPLES)
    import train_digits
    return _example_task(train_digits.DigitsTask(), "test_accuracy", True)


def text_task(args):
    """examples/train_text.py: GPT-style byte model, 0.47 M parameters."""
    sys.path.insert(0, EXAMPLES)
    import train_text
    return _example_task(train_text.TextTask(), "test_loss", False)


def _mlp_on_teacher(d_in, width, depth, classes, n_train, n_test, metric="test_accuracy"):
    """An MLP classifying generated inputs by a fixed random linear teacher (seed 1234):
    data a generator makes, so any width trains without a download. metric: test_accuracy
    or test_loss (cross-entropy; it moves from the first steps on, where accuracy of a wide
    model still sits near chance)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(1234)
    teacher = torch.randn(d_in, classes, generator=g)
    x = torch.randn(n_train + n_test, d_in, generator=g)
    y = (x @ teacher).argmax(1)
    xtr, ytr, xte, yte = x[:n_train], y[:n_train], x[n_train:], y[n_train:]

    def build_model():
        layers, d = [], d_in
        for _ in range(depth):
            layers += [nn.Linear(d, width), nn.ReLU()]
            d = width
        layers.append(nn.Linear(d, classes))
        return nn.Sequential(*layers)

    def train_batch(seed, step, rank, world, batch):
        import numpy as np
        idx = np.random.default_rng([seed, step]).choice(n_train, size=batch, replace=False)
        per = batch // world
        mine = torch.as_tensor(idx[rank * per:(rank + 1) * per])
        return xtr[mine], ytr[mine]

    def evaluate(model):
        logits = model(xte)
        if metric == "test_loss":
            return float(F.cross_entropy(logits, yte))
        return float((logits.argmax(1) == yte).float().mean())

    return Task(build_model,
                lambda model, lr: torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9),
                F.cross_entropy, train_batch, evaluate, metric, metric == "test_accuracy")


def wide_mlp_task(args):
    """Communication-heavy: 1024 -> W -> W -> 10 (W = --mlp-width; 4096: 21.0 M parameters,
    84 MB of float32 gradient a step) on generated data; held-out loss on 256 samples
    (an evaluation costs a training step's compute per 16 samples on one core)."""
    return _mlp_on_teacher(1024, args.mlp_width, 2, 10, 8192, 256, metric="test_loss")


def tiny_task(args):
    """For the short test: 256 -> 256 -> 256 -> 10, 0.13 M parameters, generated data."""
    return _mlp_on_teacher(256, 256, 2, 10, 4096, 1024)


MODELS = {"digits": digits_task, "text": text_task, "wide-mlp": wide_mlp_task,
          "tiny": tiny_task}
MODEL_DEFAULTS = {  # batch, lr
    "digits": (64, 0.05), "text": (16, 2e-3), "wide-mlp": (32, 0.05), "tiny": (32, 0.05)}


# ---------------------------------------------------------------- emulated hosts

def _run(cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), r.returncode,
                                                   (r.stderr or r.stdout).strip()))
    return r


def parse_rate(text):
    """'100mbit', '1gbit', '10gbit', '500kbit' -> bits per second."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(k|m|g)bit", text.strip().lower())
    if not m:
        raise ValueError("rate %r is not NUMBER{kbit,mbit,gbit} (e.g. 100mbit, 1gbit)" % text)
    return float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


class EmulatedNetwork:
    """Hosts (namespaces) on one bridge, each link limited by tbf to `rate_bps` both ways:
    the host's own eth0 shapes what it sends, the bridge side of its veth what it receives.
    close() (also at exit and on SIGINT/SIGTERM through the caller) removes everything."""

    def __init__(self, rate_bps, delay_ms=0.0):
        self.prefix = "gtb%d" % (os.getpid() % 100000)
        self.switch = self.prefix + "sw"
        self.rate_bps = rate_bps
        self.delay_ms = delay_ms
        self.hosts = []  # namespace names
        self._closed = False
        _run(["ip", "netns", "add", self.switch])
        atexit.register(self.close)
        _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])

    def _shape(self, ns, dev):
        rate = "%dbit" % int(self.rate_bps)
        # A burst of at least one GSO segment (64 KiB) and 4 ms of the rate; 200 ms queue.
        burst = max(128 << 10, int(self.rate_bps / 8 * 0.004))
        _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:",
              "tbf", "rate", rate, "burst", str(burst), "latency", "200ms"])
        if self.delay_ms:
            # netem's delay goes under tbf; where the kernel lacks netem this fails and says so.
            r = _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "parent",
                      "1:1", "handle", "10:", "netem", "delay", "%gms" % self.delay_ms],
                     check=False)
            if r.returncode != 0:
                raise RuntimeError("--delay-ms needs tc netem, which this kernel does not have "
                                   "(%s); latency cannot be emulated here"
                                   % (r.stderr or r.stdout).strip())

    def add_host(self):
        """A new host; returns (namespace, ip)."""
        i = len(self.hosts)
        ns, peer, ip = "%sh%d" % (self.prefix, i), "%sv%d" % (self.prefix, i), SUBNET + str(i + 1)
        _run(["ip", "netns", "add", ns])
        self.hosts.append(ns)
        _run(["ip", "link", "add", peer, "netns", self.switch, "type", "veth", "peer", "name",
              "eth0", "netns", ns])
        _run(["ip", "-n", self.switch, "link", "set", peer, "master", "br0", "up"])
        _run(["ip", "-n", ns, "addr", "add", ip + "/24", "dev", "eth0"])
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        self._shape(ns, "eth0")
        self._shape(self.switch, peer)
        return ns, ip

    def close(self):
        if self._closed:
            return
        self._closed = True
        for ns in self.hosts + [self.switch]:  # a namespace takes its veth ends with it
            _run(["ip", "netns", "del", ns], check=False)


def check_environment():
    """None if namespaces and tbf work here, else why not (one line)."""
    if os.geteuid() != 0:
        return "needs root (ip netns, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return "%s is not installed" % tool
    try:
        net = EmulatedNetwork(parse_rate("100mbit"))
        try:
            net.add_host()
        finally:
            net.close()
    except RuntimeError as e:
        return str(e)
    return None


# ---------------------------------------------------------------- one worker process

def _net_bytes():
    with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
        tx = int(f.read())
    with open("/sys/class/net/eth0/statistics/rx_bytes") as f:
        rx = int(f.read())
    return tx, rx


def _cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def worker_main(spec_path, rank):
    with open(spec_path) as f:
        spec = json.load(f)
    out = os.path.join(spec["tmp"], "worker%d.json" % rank)
    result = {"rank": rank}
    try:
        result.update(train(spec, rank))
    except Exception as e:  # pylint: disable=broad-except
        result["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
    with open(out, "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    sys.stderr.flush()
    # Tearing down DDP's reducer and gloo at exit can block in torch 1.13 (examples/common.py).
    os._exit(0)


def _time_calls(obj, names):
    """Wraps obj's methods `names` to add their seconds to obj.call_s[name] (threads add
    concurrently: with several pushes in flight the sum can exceed the step)."""
    import threading
    obj.call_s = {name: 0.0 for name in names}
    lock = threading.Lock()
    for name in names:
        inner = getattr(obj, name)

        def timed(*a, _inner=inner, _name=name, **kw):
            t0 = time.perf_counter()
            try:
                return _inner(*a, **kw)
            finally:
                with lock:
                    obj.call_s[_name] += time.perf_counter() - t0
        setattr(obj, name, timed)


def train(spec, rank):
    import torch
    import torch.distributed as dist

    args = argparse.Namespace(**spec["model_args"])
    task = MODELS[spec["model"]](args)
    world, system = spec["workers"], spec["system"]
    sys.path.insert(0, EXAMPLES)
    import common
    model, ddp = common.join_ddp(spec, rank, task)
    transport = state = None
    if system == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif system.startswith("powersgd-"):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        # PyTorch's defaults but start_powerSGD_iter (1,000 by default: plain allreduce for
        # the whole of a short run); 2 is the earliest it allows with error feedback.
        ps_state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=int(system.split("-")[1]),
            start_powerSGD_iter=2)
        ddp.register_comm_hook(ps_state, powerSGD_hook.powerSGD_hook)
    elif system in GCOMP_MODES:
        import gcomp.torch as gtorch
        from gcomp import cluster, comm
        client = cluster.connect(spec["cluster_config"], rank)
        transport = comm.ClientTransport(client)
        _time_calls(transport, ("push_pull", "quantize"))
        state = gtorch.PSHookState(transport, error_feedback=GCOMP_MODES[system][3])
        ddp.register_comm_hook(state, gtorch.ps_hook)
    opt = task.make_optimizer(model, spec["lr"])

    steps, warmup, every = spec["steps"], spec["warmup"], spec["eval_every"]
    step_s, losses, evals = [], [], []
    phases = []  # per step: forward, backward with the exchange, optimizer (seconds)
    clock = 0.0  # training seconds so far (evaluation excluded)
    eval_cpu = 0.0  # CPU seconds of evaluation after warm-up, left out of cpu_s_per_step
    for step in range(steps):
        if step == warmup:
            net0, cpu0 = _net_bytes(), _cpu_s()
            wire0 = transport.wire_bytes if transport else 0
            calls0 = dict(getattr(transport, "call_s", {}))
        x, y = task.train_batch(spec["seed"], step, rank, world, spec["batch"])
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = task.loss(ddp(x), y)
        t1 = time.perf_counter()
        loss.backward()  # DDP's exchange ends inside: it waits for every bucket's result
        t2 = time.perf_counter()
        opt.step()
        dt = time.perf_counter() - t0
        step_s.append(dt)
        phases.append([t1 - t0, t2 - t1, dt - (t2 - t0)])
        clock += dt
        losses.append(float(loss.detach()))
        if rank == 0 and ((step + 1) % every == 0 or step + 1 == steps):
            c0 = _cpu_s()
            model.eval()
            with torch.no_grad():
                evals.append([step + 1, round(clock, 4), float(task.evaluate(model))])
            model.train()
            if step >= warmup:
                eval_cpu += _cpu_s() - c0
    net1, cpu1 = _net_bytes(), _cpu_s()
    measured = steps - warmup
    result = {"step_s": step_s, "phases_s": phases, "losses": losses, "evals": evals,
              "metric": task.metric,              "higher_is_better": task.higher_is_better,
              "params": sum(p.numel() for p in model.parameters()),
              "tx_bytes_per_step": (net1[0] - net0[0]) / measured,
              "rx_bytes_per_step": (net1[1] - net0[1]) / measured,
              "cpu_s_per_step": (cpu1 - cpu0 - eval_cpu) / measured}
    if transport is not None:
        result["codec_wire_bytes_per_step"] = (transport.wire_bytes - wire0) / measured
        result["hook_call_s_per_step"] = {k: (v - calls0[k]) / measured
                                          for k, v in transport.call_s.items()}
        state.close()
        transport.close()
    dist.barrier()
    return result


# ---------------------------------------------------------------- one row

class Processes:
    """Processes started for a row, each in its own session; stop() ends them (the whole
    session), also at exit."""

    def __init__(self):
        self.procs = []
        atexit.register(self.stop)

    def start(self, cmd, log):
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs = []


def _listening(pid, port):
    want = ":%04X" % port
    for name in ("tcp", "tcp6"):
        try:
            with open("/proc/%d/net/%s" % (pid, name)) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[1].endswith(want) and parts[3] == "0A":
                        return True
        except OSError:
            pass
    return False


def _proc_cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_row(args, net, hosts, system, shards, workers, tmp):
    """Trains one row; returns its raw record (with "error" where it failed)."""
    from gcomp import cluster
    row_dir = tempfile.mkdtemp(prefix="%s-" % system, dir=tmp)
    model_args = {"mlp_width": args.mlp_width}
    spec = {"model": args.model, "model_args": model_args, "system": system,
            "workers": workers, "steps": args.steps, "warmup": args.warmup,
            "eval_every": args.eval_every, "seed": args.seed, "batch": args.batch,
            "lr": args.lr, "tmp": row_dir,
            "init_method": "file://" + os.path.join(row_dir, "process-group")}
    procs = Processes()
    shard_procs = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(PYTHONPATH), OMP_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="eth0")
    try:
        if system in GCOMP_MODES:
            mode, rel_bits, abs_log2, _ = GCOMP_MODES[system]
            addresses = ["%s:%d" % (hosts[workers + k][1], 7000) for k in range(shards)]
            config = cluster.cluster_config(addresses, workers, mode, rel_bits, abs_log2,
                                            **args.config_fields)
            spec["cluster_config"] = os.path.join(row_dir, "cluster.json")
            with open(spec["cluster_config"], "w") as f:
                json.dump(config, f)
            for k in range(shards):
                log = open(os.path.join(row_dir, "shard%d.log" % k), "w")
                shard_procs.append(procs.start(
                    ["ip", "netns", "exec", hosts[workers + k][0], cluster.server_binary(),
                     "--config", spec["cluster_config"], "--shard", str(k),
                     "--decode_threads", "2", "--log_level", "warn",
                     "--metrics_address", "127.0.0.1:0",
                     "--exit_with_parent", "--parent_pid", str(os.getpid())], log))
            deadline = time.time() + 30
            for p in shard_procs:
                while not _listening(p.pid, 7000):
                    if p.poll() is not None or time.time() > deadline:
                        raise RuntimeError("a shard did not start (%s)" % row_dir)
                    time.sleep(0.05)
        spec_path = os.path.join(row_dir, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        worker_procs = []
        for r in range(workers):
            log = open(os.path.join(row_dir, "worker%d.log" % r), "w")
            worker_procs.append(subprocess.Popen(
                ["ip", "netns", "exec", hosts[r][0], sys.executable, os.path.abspath(__file__),
                 "--role", "worker", "--spec", spec_path, "--rank", str(r)],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
            procs.procs.append(worker_procs[-1])
        start = time.time()
        for p in worker_procs:
            left = max(1.0, args.row_timeout_s - (time.time() - start))
            try:
                p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                break
        shard_cpu = sum(_proc_cpu_s(p.pid) for p in shard_procs if p.poll() is None)
        outs = []
        for r in range(workers):
            path = os.path.join(row_dir, "worker%d.json" % r)
            if os.path.exists(path):
                with open(path) as f:
                    outs.append(json.load(f))
            else:
                with open(os.path.join(row_dir, "worker%d.log" % r)) as f:
                    tail = [l for l in f.read().splitlines() if l.strip()][-1:]
                code = worker_procs[r].poll()
                outs.append({"rank": r, "error": "worker %d %s: %s" % (
                    r, "timed out" if code is None else "exited %d" % code,
                    tail[0] if tail else "no output")})
    finally:
        procs.stop()
    record = {"system": system, "shards": shards if system in GCOMP_MODES else 0,
              "workers": workers}
    # A process that died (gloo aborts) first: the others then only saw their peer go.
    errors = sorted((o["error"] for o in outs if "error" in o),
                    key=lambda e: " exited " not in e)
    if errors:
        record["error"] = errors[0][:300]
        return record
    w0 = outs[0]
    record.update({
        "params": w0["params"], "metric": w0["metric"],
        "higher_is_better": w0["higher_is_better"],
        "median_step_s": statistics.median(w0["step_s"][args.warmup:]),
        "step_s": w0["step_s"], "evals": w0["evals"],
        "median_phases_s": [statistics.median(p[i] for p in w0["phases_s"][args.warmup:])
                            for i in range(3)], "final_metric": w0["evals"][-1][2],
        "train_loss": statistics.mean(statistics.mean(o["losses"][-3:]) for o in outs),
        "tx_bytes_per_step": statistics.mean(o["tx_bytes_per_step"] for o in outs),
        "rx_bytes_per_step": statistics.mean(o["rx_bytes_per_step"] for o in outs),
        "cpu_s_per_step": statistics.mean(o["cpu_s_per_step"] for o in outs),
        "shard_cpu_s_per_step": shard_cpu / args.steps,
    })
    for key in ("codec_wire_bytes_per_step", "hook_call_s_per_step"):
        if key in w0:
            record[key] = w0[key]
    return record


# ---------------------------------------------------------------- table and plot

def time_to_target(rec, target):
    if "error" in rec:
        return None
    for _, clock, value in rec["evals"]:
        if (value >= target) if rec["higher_is_better"] else (value <= target):
            return clock
    return None


def derive_target(ddp_final, higher_is_better):
    """The stated target: what plain DDP reached at the end, less 1 point of accuracy or
    plus 1% of loss."""
    return ddp_final - 0.01 if higher_is_better else ddp_final * 1.01


def _spread(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    mid = statistics.median(values)
    if len(values) == 1:
        return fmt % mid
    return (fmt + " (" + fmt + "-" + fmt + ")") % (mid, min(values), max(values))


def render(records):
    """Markdown table from raw records (any number of repeats): medians over repeats,
    min-max in brackets; speedups against the ddp row of the same rate, W and repeat."""
    groups = {}
    for rec in records:
        groups.setdefault((rec["model"], rec["rate"], rec["workers"]), []).append(rec)
    lines = []
    for (model, rate, workers), recs in groups.items():
        base = {r["repeat"]: r for r in recs if r["system"] == "ddp" and "error" not in r}
        if not base:
            lines.append("\n%s, %s, W = %d: no ddp baseline row finished\n" % (model, rate,
                                                                             workers))
            continue
        any_base = next(iter(base.values()))
        targets = {rep: derive_target(b["final_metric"], b["higher_is_better"])
                   for rep, b in base.items()}
        lines.append("\n**%s** (%.2f M parameters), link %s, W = %d; target %s %s %s "
                     "(DDP's final %s %s 1%s)\n"
                     % (model, any_base["params"] / 1e6, rate, workers, any_base["metric"],
                        ">=" if any_base["higher_is_better"] else "<=",
                        _spread(list(targets.values()), "%.4f"), any_base["metric"],
                        "-" if any_base["higher_is_better"] else "+",
                        " point" if any_base["higher_is_better"] else "%"))
        lines.append("| system | S | runs | median step s | x DDP (step) | time to target s "
                     "| x DDP (target) | final %s | sent MB/step | recv MB/step | worker CPU "
                     "s/step | shard CPU s/step |" % any_base["metric"])
        lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
                     "| ---: | ---: |")
        order = []
        for r in recs:
            if (r["system"], r["shards"]) not in order:
                order.append((r["system"], r["shards"]))
        for system, shards in order:
            rows = [r for r in recs if (r["system"], r["shards"]) == (system, shards)]
            failed = [r for r in rows if "error" in r]
            ok = [r for r in rows if "error" not in r]
            s = str(shards) if shards else "-"
            if not ok:
                lines.append("| %s | %s | %d | failed: %s | | | | | | | | |"
                             % (system, s, len(rows), failed[0]["error"].replace("|", "/")))
                continue
            speed, ttt, speed_t = [], [], []
            for r in ok:
                b = base.get(r["repeat"])
                t = time_to_target(r, targets[r["repeat"]]) if b else None
                ttt.append(t)
                if b:
                    speed.append(b["median_step_s"] / r["median_step_s"])
                    tb = time_to_target(b, targets[r["repeat"]])
                    if t and tb:
                        speed_t.append(tb / t)
            runs = "%d" % len(ok) + (" (+%d failed)" % len(failed) if failed else "")
            reached = sum(t is not None for t in ttt)
            ttt_text = _spread(ttt, "%.1f")
            if reached < len(ok):
                ttt_text += " (%d of %d reached)" % (reached, len(ok))
            lines.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                system, s, runs, _spread([r["median_step_s"] for r in ok], "%.3f"),
                _spread(speed, "%.2f"), ttt_text, _spread(speed_t, "%.2f"),
                _spread([r["final_metric"] for r in ok], "%.4f"),
                _spread([r["tx_bytes_per_step"] / 1e6 for r in ok], "%.2f"),
                _spread([r["rx_bytes_per_step"] / 1e6 for r in ok], "%.2f"),
                _spread([r["cpu_s_per_step"] for r in ok], "%.3f"),
                _spread([r["shard_cpu_s_per_step"] for r in ok], "%.3f")))
    return "\n".join(lines) + "\n"


def plot(records, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print("note: no plot (matplotlib unavailable: %s)" % e, file=sys.stderr)
        return False
    keys = []
    for r in records:
        k = (r["model"], r["rate"], r["workers"])
        if k not in keys:
            keys.append(k)
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
    for ax, k in zip(axes[0], keys):
        rows = [r for r in records if (r["model"], r["rate"], r["workers"]) == k
                and "error" not in r]
        labels = []
        for r in rows:
            label = r["system"] + ("/S%d" % r["shards"] if r["shards"] else "")
            if label not in labels:
                labels.append(label)
        meds = [statistics.median(r["median_step_s"] for r in rows
                                  if r["system"] + ("/S%d" % r["shards"] if r["shards"]
                                                    else "") == lab) for lab in labels]
        ax.barh(labels, meds)
        ax.set_xlabel("median step (s)")
        ax.set_title("%s, %s, W=%d" % k)
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


# ---------------------------------------------------------------- the launcher

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="wide-mlp")
    p.add_argument("--rates", default="100mbit,1gbit",
                   help="comma-separated link rates, e.g. 100mbit,1gbit,10gbit")
    p.add_argument("--delay-ms", type=float, default=0.0,
                   help="one-way delay on every link (needs tc netem; refused where the "
                        "kernel lacks it)")
    p.add_argument("--workers", default="2", help="comma-separated W values, e.g. 2,4")
    p.add_argument("--shards", default="1,2", help="comma-separated S values for gcomp rows")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help="comma-separated, from: " + ", ".join(SYSTEMS))
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=1,
                   help="first steps left out of step times, bytes and CPU (DDP and the "
                        "shards set up in them)")
    p.add_argument("--eval-every", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, help="global batch (default per model)")
    p.add_argument("--lr", type=float, help="learning rate (default per model)")
    p.add_argument("--mlp-width", type=int, default=4096, help="wide-mlp's hidden width")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                   help="a cluster config field for the gcomp rows (docs/SERVICE.md), e.g. "
                        "--set max_inflight_chunks=16 --set chunk_bytes=524288; repeatable")
    p.add_argument("--row-timeout-s", type=float, default=600)
    p.add_argument("--out-dir", default="train-bench-out")
    p.add_argument("--role", choices=("launcher", "worker"), default="launcher",
                   help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role == "worker":
        return args
    try:
        args.rate_list = [(r.strip(), parse_rate(r)) for r in args.rates.split(",")]
        args.worker_list = [int(w) for w in args.workers.split(",")]
        args.shard_list = [int(s) for s in args.shards.split(",")]
    except ValueError as e:
        p.error("--rates/--workers/--shards: %s" % e)
    args.config_fields = {}
    for item in args.set:
        field, sep, value = item.partition("=")
        if not sep or not field:
            p.error("--set %r is not FIELD=VALUE" % item)
        try:
            args.config_fields[field] = json.loads(value)
        except ValueError:
            p.error("--set %s: %r is not a JSON value (a number, \"text\", {...})"
                    % (field, value))
    args.system_list = [s.strip() for s in args.systems.split(",")]
    for s in args.system_list:
        if s not in SYSTEMS:
            p.error("--systems: unknown system %r (known: %s)" % (s, ", ".join(SYSTEMS)))
    for name, value, low in (("--steps", args.steps, 2), ("--eval-every", args.eval_every, 1),
                             ("--repeats", args.repeats, 1), ("--mlp-width", args.mlp_width, 1)):
        if value < low:
            p.error("%s must be at least %d, got %d" % (name, low, value))
    if not 0 <= args.warmup < args.steps:
        p.error("--warmup must be in [0, --steps), got %d" % args.warmup)
    if min(args.worker_list) < 1 or min(args.shard_list) < 1:
        p.error("--workers and --shards must be at least 1")
    if args.delay_ms < 0:
        p.error("--delay-ms must be >= 0")
    batch, lr = MODEL_DEFAULTS[args.model]
    args.batch = args.batch or batch
    args.lr = args.lr or lr
    for w in args.worker_list:
        if args.batch % w:
            p.error("--batch %d must be a multiple of every --workers value (%d)"
                    % (args.batch, w))
    return args


def launcher_main(args):
    why = check_environment()
    if why:
        raise SystemExit("error: emulated hosts unavailable here: " + why)
    sys.path[:0] = PYTHONPATH
    if any(s in GCOMP_MODES for s in args.system_list):
        from gcomp import cluster
        import gcomp
        if not gcomp.have_extension() or cluster.server_missing():
            raise SystemExit("error: gcomp rows need the extension and gcomp_server: bazel "
                             "build //python:_gcomp.so //server:gcomp_server (%s)"
                             % (gcomp.extension_error() or cluster.server_missing()))
    # Also where the shell started it with SIGINT ignored (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # SIGTERM ends the run like Ctrl-C: through the finally blocks and atexit, which
    # remove the processes and namespaces.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.makedirs(args.out_dir, exist_ok=True)
    jsonl = os.path.join(args.out_dir, "runs.jsonl")
    records = []
    run_id = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="train-bench-") as tmp:
        os.chmod(tmp, 0o755)
        for rate_name, rate in args.rate_list:
            net = EmulatedNetwork(rate, args.delay_ms)
            try:
                try:
                    hosts = [net.add_host() for _ in range(max(args.worker_list)
                                                              + max(args.shard_list))]
                except RuntimeError as e:
                    raise SystemExit("error: %s" % e)
                for workers in args.worker_list:
                    for repeat in range(args.repeats):
                        for system in args.system_list:
                            for shards in (args.shard_list if system in GCOMP_MODES else [0]):
                                t0 = time.time()
                                rec = run_row(args, net, hosts, system, shards, workers, tmp)
                                rec.update({"run": run_id, "model": args.model,
                                            "rate": rate_name, "rate_bps": rate,
                                            "delay_ms": args.delay_ms, "repeat": repeat,
                                            "steps": args.steps, "batch": args.batch,
                                            "lr": args.lr, "seed": args.seed,
                                            "config_set": args.config_fields,
                                            "row_seconds": round(time.time() - t0, 1)})
                                records.append(rec)
                                with open(jsonl, "a") as f:
                                    f.write(json.dumps(rec) + "\n")
                                print("%s W=%d %s S=%s rep %d: %s" % (
                                    rate_name, workers, system, shards or "-", repeat,
                                    rec.get("error") or "median step %.3f s, final %s %.4f"
                                    % (rec["median_step_s"], rec["metric"],
                                       rec["final_metric"])), flush=True)
            finally:
                net.close()
    table = render(records)
    with open(os.path.join(args.out_dir, "table.md"), "w") as f:
        f.write(table)
    print(table)
    if plot(records, os.path.join(args.out_dir, "plot.png")):
        print("plot: %s" % os.path.join(args.out_dir, "plot.png"))
    return records


def main(argv=None):
    args = parse_args(argv)
    if args.role == "worker":
        if args.spec is None or args.rank is None:
            raise SystemExit("error: --role worker needs --spec and --rank")
        worker_main(args.spec, args.rank)
        return None
    try:
        return launcher_main(args)
    except KeyboardInterrupt:
        raise SystemExit("interrupted; hosts and processes removed")


if __name__ == "__main__":
    main()
