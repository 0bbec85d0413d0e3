"""What both training examples share: flags, the local cluster, W worker processes,
data-parallel training through gcomp.torch.ps_hook, and the final JSON line.

The launcher (no --rank) starts S shards (real gcomp_server processes) when the parameter
server is available, then W copies of the script as workers; each worker trains one slice
of every global batch under DDP with the hook, writes its losses and byte counts to a file,
and rank 0 also evaluates on the held-out split. The launcher prints one JSON line:
mode, steps, train_loss, test_accuracy|test_loss, raw_bytes, wire_bytes, ratio, seconds.
"""
import argparse
import json
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
    p.add_argument("--mode", choices=MODES, default="near-lossless")
    p.add_argument("--workers", type=int, default=defaults.get("workers", 2))
    p.add_argument("--shards", type=int, default=defaults.get("shards", 2))
    p.add_argument("--steps", type=int, default=defaults["steps"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=defaults["batch"],
                   help="global batch size (split evenly across workers)")
    p.add_argument("--lr", type=float, default=defaults["lr"])
    p.add_argument("--rel-bits", type=int, default=defaults.get("rel_bits", 7),
                   help="near-lossless: mantissa bits kept near the block maximum")
    p.add_argument("--abs-log2", type=int, default=defaults.get("abs_log2", -16),
                   help="near-lossless: log2 of the error floor relative to the block maximum")
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
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--worker-spec", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.batch % args.workers:
        p.error("--batch must be a multiple of --workers")
    if args.preset:
        if args.mode != "near-lossless":
            p.error("--preset %s is a near-lossless setting; use --mode near-lossless"
                    % args.preset)
        for key, value in PRESETS[args.preset].items():
            setattr(args, key, value)
    return args


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
        spec = dict(vars(args), transport=transport, port=free_port(), tmp=tmp,
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
    losses = np.mean([o["losses"] for o in outs], axis=0)  # equal slices: the global loss
    tail = max(1, len(losses) // 10)
    raw = sum(o["raw_bytes"] for o in outs)
    wire = sum(o["wire_bytes"] for o in outs)
    result = {"mode": args.mode, "steps": args.steps,
              "train_loss": round(float(np.mean(losses[-tail:])), 6)}
    result.update({k: v for k, v in outs[0]["eval"].items()})
    result.update({"raw_bytes": int(raw), "wire_bytes": int(wire),
                   "ratio": round(raw / wire, 4) if wire else 0.0,
                   "seconds": round(time.time() - start, 2), "transport": transport})
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


def run_worker(args, task):
    """task: object with build_model(), train_batch(step, rank, world), evaluate(model)."""
    import torch.distributed as dist
    import gcomp.torch as gtorch
    from torch.nn.parallel import DistributedDataParallel as DDP

    with open(args.worker_spec) as f:
        spec = json.load(f)
    rank, world = args.rank, spec["workers"]
    torch.set_num_threads(1)
    # Gloo otherwise picks the interface its hostname resolves to, which on some machines
    # is not reachable between local processes, and the group hangs at start-up.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % spec["port"],
                            rank=rank, world_size=world)
    torch.manual_seed(spec["seed"])
    model = task.build_model()
    ddp = DDP(model)
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
    with open(os.path.join(spec["tmp"], "worker%d.json" % rank), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()
    # The result is written. Tearing down DDP's reducer and its gloo group at exit
    # sometimes blocked forever in torch 1.13 once the other ranks had exited (seen about
    # once in 15 runs of python/tests/hook_test.py), so skip the destructors.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def global_batch_indices(seed, step, n, batch):
    """The step's global batch (same on every worker): indices into n training samples."""
    rng = np.random.default_rng([seed, step])
    return rng.choice(n, size=batch, replace=False)


def main(task, description, defaults, script):
    args = parse_args(description, defaults)
    if args.rank is not None:
        run_worker(args, task)
        return
    result = launch(args, script)
    print(json.dumps(result), flush=True)
