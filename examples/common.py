"""What both training examples share: flags, the local cluster, W worker processes,
data-parallel training through gcomp.torch.ps_hook, and the final JSON line.

The launcher (no --rank) starts S shards (real gcomp_server processes) when the parameter
server is available, then W copies of the script as workers; each worker trains one slice
of every global batch under DDP with the hook, writes its losses and byte counts to a file,
and rank 0 also evaluates on the held-out split. The launcher prints one JSON line:
mode, steps, train_loss, test_accuracy|test_loss, raw_bytes, wire_bytes, ratio, seconds,
transport.

With --cluster-config the script is one worker of a job whose shards already run (a pod of
a Kubernetes Indexed Job, deploy/k8s/examples/): its index comes from --worker-index (or
JOB_COMPLETION_INDEX, or RANK as torchrun and Kubeflow's PyTorchJob set it, with WORLD_SIZE
checked against the config's workers), the process group meets at --master (or MASTER_ADDR and
MASTER_PORT), the worker count and codec come from the config, and worker 0 prints the
job's JSON line.
"""
import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, HERE)
import progress_line  # noqa: E402

MODES = ("none", "lossless", "near-lossless")

# Named settings of near-lossless. "aggressive": 3 mantissa bits near each block's
# maximum and an error floor of 2^-10 of it, |error| <= max(2^-4 |x|, 2^-10 M) per element
# and direction each step, with error feedback, so what a step leaves out is pushed with
# the next one instead of being lost (docs/BENCHMARKS.md, "Training", has its results).
PRESETS = {"aggressive": {"rel_bits": 3, "abs_log2": -10, "error_feedback": True}}


def parse_args(description, defaults):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--mode", choices=MODES,
                   help="codec on the wire (default near-lossless; with --cluster-config, the "
                        "config's uplink mode)")
    p.add_argument("--workers", type=int,
                   help="worker processes (default %d; with --cluster-config, the config's "
                        "workers)" % defaults.get("workers", 2))
    p.add_argument("--shards", type=int, default=defaults.get("shards", 2))
    p.add_argument("--steps", type=int, default=defaults["steps"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=defaults["batch"],
                   help="global batch size (split evenly across workers)")
    p.add_argument("--lr", type=float, default=defaults["lr"])
    p.add_argument("--rel-bits", type=int,
                   help="near-lossless: mantissa bits kept near the block maximum (default %d)"
                        % defaults.get("rel_bits", 7))
    p.add_argument("--abs-log2", type=int,
                   help="near-lossless: log2 of the error floor relative to the block maximum "
                        "(default %d)" % defaults.get("abs_log2", -16))
    p.add_argument("--error-feedback", action="store_true")
    p.add_argument("--preset", choices=sorted(PRESETS),
                   help="near-lossless settings by name (sets --rel-bits, --abs-log2 and "
                        "--error-feedback): aggressive = R 3, A -10, error feedback")
    p.add_argument("--transport", choices=("auto", "ps", "gloo"), default="auto",
                   help="ps: local cluster of gcomp_server shards; gloo: the same arithmetic "
                        "over a process group (no shards); auto: ps when built")
    p.add_argument("--loss-log", help="write per-step global training loss (JSON) here")
    p.add_argument("--progress", choices=progress_line.MODES, default="auto",
                   help="a progress line (step, steps/s, ratio, ETA) on stderr; auto: only "
                        "when stderr is a terminal")
    p.add_argument("--cluster-config", metavar="FILE",
                   help="join the running shards of this cluster config as one worker "
                        "instead of starting a local cluster (see the module docstring)")
    p.add_argument("--worker-index", type=int,
                   help="with --cluster-config: this worker's index (default: "
                        "JOB_COMPLETION_INDEX, else RANK)")
    p.add_argument("--master", metavar="HOST:PORT",
                   help="with --cluster-config: where worker 0 hosts the process group "
                        "(default: MASTER_ADDR:MASTER_PORT)")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--worker-spec", help=argparse.SUPPRESS)
    args = p.parse_args()
    # What the command line set, before defaults and the config fill the rest in.
    given = {"rel_bits": args.rel_bits, "abs_log2": args.abs_log2}
    try:
        if args.cluster_config:
            resolve_from_config(args)
        else:
            for flag in ("worker_index", "master"):
                if getattr(args, flag) is not None:
                    raise ValueError("--%s needs --cluster-config" % flag.replace("_", "-"))
            args.mode = args.mode or "near-lossless"
            if args.workers is None:
                args.workers = defaults.get("workers", 2)
            if args.preset:
                if args.mode != "near-lossless":
                    raise ValueError("--preset %s is a near-lossless setting; use --mode "
                                     "near-lossless" % args.preset)
                for key, value in given.items():
                    if value is not None and value != PRESETS[args.preset][key]:
                        raise ValueError("--preset %s sets --%s %d; --%s %d disagrees"
                                         % (args.preset, key.replace("_", "-"),
                                            PRESETS[args.preset][key], key.replace("_", "-"),
                                            value))
                for key, value in PRESETS[args.preset].items():
                    setattr(args, key, value)
            if args.rel_bits is None:
                args.rel_bits = defaults.get("rel_bits", 7)
            if args.abs_log2 is None:
                args.abs_log2 = defaults.get("abs_log2", -16)
        check_settings(args, given)
    except ValueError as e:
        p.error(str(e))
    return args


def check_settings(args, given):
    """Raises ValueError naming the first flag whose value cannot make a run, before any
    process starts (a bad value would otherwise end in a worker's traceback). given: the
    near-lossless settings as the command line set them (None where it did not)."""
    for flag, low in (("workers", 1), ("shards", 1), ("steps", 1), ("batch", 1)):
        if getattr(args, flag) < low:
            raise ValueError("--%s must be at least %d, got %d" % (flag, low, getattr(args, flag)))
    if args.batch % args.workers:
        raise ValueError("--batch %d must be a multiple of --workers (%d)"
                         % (args.batch, args.workers))
    if not (math.isfinite(args.lr) and args.lr > 0):
        raise ValueError("--lr must be a positive number, got %r" % args.lr)
    if args.mode != "near-lossless":
        # These only change near-lossless; accepting them would print results of a run
        # that did not do what was asked.
        if args.error_feedback:
            raise ValueError("--error-feedback needs --mode near-lossless (with --mode %s "
                             "nothing is left out to feed back)" % args.mode)
        for flag in ("rel_bits", "abs_log2"):
            if given[flag] is not None:
                raise ValueError("--%s is a near-lossless setting; --mode is %s"
                                 % (flag.replace("_", "-"), args.mode))
        return
    from gcomp import codec
    try:
        codec.Policy(mode=args.mode, rel_bits=args.rel_bits, abs_log2=args.abs_log2)
    except ValueError as e:
        raise ValueError("near-lossless setting out of range (--rel-bits, --abs-log2): %s" % e)


def _env_int(names):
    for name in names:
        if os.environ.get(name, "") != "":
            try:
                return int(os.environ[name])
            except ValueError:
                raise ValueError("%s=%r is not an integer" % (name, os.environ[name]))
    return None


def resolve_from_config(args):
    """Fills the job's settings from --cluster-config and the environment; raises
    ValueError naming a flag that disagrees with the config or a setting that is missing."""
    import gcomp
    from gcomp import cluster
    if not gcomp.have_extension():
        raise ValueError("--cluster-config needs the worker Client: %s" % gcomp.extension_error())
    if not getattr(gcomp.extension(), "HAS_CLIENT", False):
        raise ValueError("--cluster-config needs the worker Client; the extension was built "
                         "without it")
    config = cluster.read_config(args.cluster_config)
    up = config["uplink"]
    taken = {"mode": up["mode"], "workers": config["workers"],
             "rel_bits": up["rel_bits"], "abs_log2": up["abs_log2"]}
    if args.preset:
        if up["mode"] != "near-lossless":
            raise ValueError("--preset %s is a near-lossless setting, but uplink.mode is %s in %s"
                             % (args.preset, up["mode"], args.cluster_config))
        args.error_feedback = PRESETS[args.preset]["error_feedback"]
        for key in ("rel_bits", "abs_log2"):
            if PRESETS[args.preset][key] != up[key]:
                raise ValueError("--preset %s needs uplink.%s: %d, but %s has %d"
                                 % (args.preset, key, PRESETS[args.preset][key],
                                    args.cluster_config, up[key]))
    for key, value in taken.items():
        given = getattr(args, key)
        if given is not None and given != value:
            name = "workers" if key == "workers" else "uplink." + key
            raise ValueError("--%s %s disagrees with %s: %s in %s (the config sets it)"
                             % (key.replace("_", "-"), given, name, value, args.cluster_config))
        setattr(args, key, value)
    args.shards = len(config["shards"])
    if args.transport == "gloo":
        raise ValueError("--cluster-config joins the shards of the config; it cannot use "
                         "--transport gloo")
    if args.worker_index is None:
        args.worker_index = _env_int(("JOB_COMPLETION_INDEX", "RANK"))
    if args.worker_index is None:
        raise ValueError("--cluster-config needs --worker-index (or JOB_COMPLETION_INDEX or "
                         "RANK in the environment)")
    # torchrun and Kubeflow's PyTorchJob set WORLD_SIZE: a job sized apart from the
    # config would wait at every step for workers that never come.
    world = _env_int(("WORLD_SIZE",))
    if world is not None and world != args.workers:
        raise ValueError("WORLD_SIZE=%d disagrees with workers: %d in %s (the config sets it)"
                         % (world, args.workers, args.cluster_config))
    if not 0 <= args.worker_index < args.workers:
        raise ValueError("worker index %d is outside [0, %d): %s has workers: %d"
                         % (args.worker_index, args.workers, args.cluster_config, args.workers))
    if args.master is None:
        addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
        if not addr or not port:
            raise ValueError("--cluster-config needs --master HOST:PORT (or MASTER_ADDR and "
                             "MASTER_PORT in the environment): where worker 0 hosts the "
                             "process group")
        args.master = "%s:%s" % (addr, port)
    host, sep, port = args.master.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("--master %r is not HOST:PORT" % args.master)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ps_available():
    """None if the parameter server can be used here, else why not."""
    import gcomp
    from gcomp import cluster
    if not gcomp.have_extension():
        return gcomp.extension_error()
    if not getattr(gcomp.extension(), "HAS_CLIENT", False):
        return "the extension was built without the worker Client"
    return cluster.server_missing()


def choose_transport(args):
    """The transport the job runs on ("ps" or "gloo"). Raises SystemExit with one line
    naming what is missing and the fix when the one asked for cannot run, before any
    worker starts."""
    import gcomp
    build = "build it with: bazel build //python:_gcomp.so //server:gcomp_server"
    if args.mode != "none" and not gcomp.have_extension():
        # Both transports compress with the extension's codec.
        raise SystemExit("error: --mode %s needs the _gcomp extension, which is not built; %s"
                         " (or run with --mode none)" % (args.mode, build))
    if args.transport == "gloo":
        return "gloo"
    why = ps_available()
    if args.transport == "ps":
        if why is not None:
            raise SystemExit("error: --transport ps cannot run: %s; %s (or use --transport "
                             "gloo)" % (why, build))
        return "ps"
    if why is not None:
        print("note: parameter server unavailable (%s); using the gloo transport" % why,
              file=sys.stderr)
    return "ps" if why is None else "gloo"


def launch(args, script):
    """Runs the whole job; returns the result dict (also printed as the final JSON line)."""
    transport = choose_transport(args)
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="gcomp-train-") as tmp:
        spec = dict(vars(args), transport=transport, tmp=tmp,
                    show_progress=progress_line.enabled(args.progress, sys.stderr))
        cluster_ctx = None
        if transport == "ps":
            from gcomp import cluster
            cluster_ctx = cluster.LocalCluster(
                shards=args.shards, workers=args.workers, mode=args.mode,
                rel_bits=args.rel_bits, abs_log2=args.abs_log2, workdir=tmp)
            cluster_ctx.start()
            spec["cluster_config"] = cluster_ctx.config_path
        try:
            spec_path = os.path.join(tmp, "spec.json")
            with open(spec_path, "w") as f:
                json.dump(spec, f)
            procs = [subprocess.Popen([sys.executable, script, "--rank", str(r),
                                       "--worker-spec", spec_path])
                     for r in range(args.workers)]
            codes = [p.wait() for p in procs]
        finally:
            if cluster_ctx is not None:
                cluster_ctx.stop()
        if any(codes):
            raise SystemExit("worker exit codes %s" % codes)
        outs = []
        for r in range(args.workers):
            with open(os.path.join(tmp, "worker%d.json" % r)) as f:
                outs.append(json.load(f))
    return summarize(args, outs, time.time() - start, transport)


def summarize(args, outs, seconds, transport):
    """The job's result line from every worker's result (outs[r] is worker r's); writes
    --loss-log."""
    losses = np.mean([o["losses"] for o in outs], axis=0)  # equal slices: the global loss
    tail = max(1, len(losses) // 10)
    raw = sum(o["raw_bytes"] for o in outs)
    wire = sum(o["wire_bytes"] for o in outs)
    result = {"mode": args.mode, "steps": args.steps,
              "train_loss": round(float(np.mean(losses[-tail:])), 6)}
    result.update({k: v for k, v in outs[0]["eval"].items()})
    result.update({"raw_bytes": int(raw), "wire_bytes": int(wire),
                   "ratio": round(raw / wire, 4) if wire else 0.0,
                   "seconds": round(seconds, 2), "transport": transport})
    if args.loss_log:
        with open(args.loss_log, "w") as f:
            json.dump({"mode": args.mode, "transport": transport,
                       "losses": [float(x) for x in losses], "result": result}, f)
    return result


def make_transport(spec, rank):
    from gcomp import comm
    policy = comm.policy_for(spec["mode"], spec["rel_bits"], spec["abs_log2"])
    if spec["transport"] == "gloo":
        return comm.GlooTransport(spec["mode"], policy)
    from gcomp import cluster
    client = cluster.connect(spec["cluster_config"], rank)
    return comm.ClientTransport(client, policy)


def join_ddp(spec, rank, task):
    """Joins the job's gloo process group (spec["init_method"], spec["workers"] ranks) and
    returns (model, its DDP wrapper), the model built after seeding with spec["seed"] so
    every rank starts from the same weights. One thread per worker process: W of them share
    the host's cores."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=spec["init_method"], rank=rank,
                            world_size=spec["workers"])
    torch.manual_seed(spec["seed"])
    model = task.build_model()
    return model, DDP(model)


def run_worker(spec, rank, task):
    """Trains this worker's slices in the job's process group (spec["init_method"]) and
    returns its result: losses, byte counts, and for worker 0 the held-out evaluation.
    task: object with build_model(), train_batch(step, rank, world), evaluate(model)."""
    import gcomp.torch as gtorch

    world = spec["workers"]
    model, ddp = join_ddp(spec, rank, task)
    transport = make_transport(spec, rank)
    state = gtorch.PSHookState(transport, error_feedback=spec["error_feedback"])
    ddp.register_comm_hook(state, gtorch.ps_hook)
    opt = task.make_optimizer(model, spec["lr"])
    losses = []
    # Rank 0 speaks for the job (its stderr is the launcher's); the ratio is its own.
    printer = progress_line.Printer(sys.stderr, rank == 0 and spec.get("show_progress", False))
    meter = progress_line.Meter(spec["steps"], time.monotonic())
    for step in range(spec["steps"]):
        x, y = task.train_batch(spec["seed"], step, rank, world, spec["batch"])
        opt.zero_grad(set_to_none=False)
        loss = task.loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if printer.enabled:
            printer.show(meter.update(step + 1, transport.raw_bytes, transport.wire_bytes,
                                      time.monotonic()))
    printer.finish()
    state.close()
    result = {"losses": losses, "raw_bytes": transport.raw_bytes,
              "wire_bytes": transport.wire_bytes, "eval": {}}
    if rank == 0:
        model.eval()
        with torch.no_grad():
            result["eval"] = task.evaluate(model)
    transport.close()
    return result


def exit_worker():
    """Leaves the process group and exits. Tearing down DDP's reducer and its gloo group
    at exit sometimes blocked forever in torch 1.13 once the other ranks had exited (seen
    about once in 15 runs of python/tests/hook_test.py), so the destructors are skipped."""
    import torch.distributed as dist
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def local_worker(args, task):
    """Worker `--rank` of the local launcher: its result goes to a file the launcher reads."""
    with open(args.worker_spec) as f:
        spec = json.load(f)
    # Gloo otherwise picks the interface its hostname resolves to, which on some machines
    # is not reachable between local processes, and the group hangs at start-up.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # The group meets in a file of the run's folder: a TCP port chosen beforehand could be
    # taken meanwhile (a shard's listening or metrics port, another job), failing the start
    # with "Address already in use".
    spec["init_method"] = "file://" + os.path.join(spec["tmp"], "process-group")
    result = run_worker(spec, args.rank, task)
    with open(os.path.join(spec["tmp"], "worker%d.json" % args.rank), "w") as f:
        json.dump(result, f)
    exit_worker()


def cluster_worker(args, task):
    """One worker of a job on running shards (--cluster-config): worker 0 gathers every
    worker's result and prints the job's JSON line."""
    import torch.distributed as dist
    start = time.time()
    spec = dict(vars(args), transport="ps", init_method="tcp://" + args.master,
                show_progress=progress_line.enabled(args.progress, sys.stderr))
    result = run_worker(spec, args.worker_index, task)
    outs = [None] * args.workers
    dist.all_gather_object(outs, result)
    if args.worker_index == 0:
        print(json.dumps(summarize(args, outs, time.time() - start, "ps")), flush=True)
    exit_worker()


def global_batch_indices(seed, step, n, batch):
    """The step's global batch (same on every worker): indices into n training samples."""
    rng = np.random.default_rng([seed, step])
    return rng.choice(n, size=batch, replace=False)


def main(task, description, defaults, script):
    args = parse_args(description, defaults)
    if args.rank is not None:
        local_worker(args, task)
        return
    if args.cluster_config:
        cluster_worker(args, task)
        return
    result = launch(args, script)
    print(json.dumps(result), flush=True)
