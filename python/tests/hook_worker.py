"""One rank of hook_test: DDP with gcomp.torch.ps_hook (and GradientSync) under a gloo
process group, checked against the mean of every rank's own gradients."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import gcomp.torch as gtorch  # noqa: E402
from gcomp import comm  # noqa: E402


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


def reference_mean(model, x, y, world):
    """Every rank's plain gradient, gathered, summed in rank order, divided by world."""
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    parts = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(parts, flat)
    total = parts[0].clone()
    for p in parts[1:]:
        total += p
    return total / world


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--rank", type=int)
    a.add_argument("--world", type=int)
    a.add_argument("--port", type=int)
    a.add_argument("--mode")
    a.add_argument("--out")
    a.add_argument("--cluster-config", help="push-pull through these shards (else gloo)")
    args = a.parse_args()
    torch.set_num_threads(1)
    # Gloo otherwise picks the interface its hostname resolves to, which on some machines
    # is not reachable between local processes, and the group hangs at start-up.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port,
                            rank=args.rank, world_size=args.world)
    result = {"ddp_max_err": [], "sync_max_err": [], "ref_max_abs": []}

    # DDP with small buckets, so several keys and DDP's bucket rebuild are exercised.
    model, plain = make_model(), make_model()
    ddp = DDP(model, bucket_cap_mb=0.05)
    def make_transport():
        if args.cluster_config:
            from gcomp import cluster
            return comm.ClientTransport(cluster.connect(args.cluster_config, args.rank),
                                        comm.policy_for(args.mode))
        return comm.GlooTransport(args.mode)

    transport = make_transport()
    state = gtorch.PSHookState(transport, error_feedback=(args.mode == "near-lossless"))
    ddp.register_comm_hook(state, gtorch.ps_hook)
    for step in range(3):
        x, y = batch(args.rank, step)
        plain.load_state_dict(model.state_dict())
        ref = reference_mean(plain, x, y, args.world)
        model.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        result["ddp_max_err"].append(float((got - ref).abs().max()))
        result["ref_max_abs"].append(float(ref.abs().max()))
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    state.close()
    result["ddp_keys"] = sorted(state._steps)
    result["ddp_raw_bytes"], result["ddp_wire_bytes"] = transport.raw_bytes, transport.wire_bytes
    transport.close()
    result["residual_keys"] = len(state._residuals)

    # The same without DDP.
    model = make_model()
    sync = gtorch.GradientSync(model, make_transport(), bucket_bytes=64 << 10)
    for step in range(2):
        x, y = batch(args.rank, step)
        plain.load_state_dict(model.state_dict())
        ref = reference_mean(plain, x, y, args.world)
        model.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        sync.sync()
        got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        result["sync_max_err"].append(float((got - ref).abs().max()))
    sync.close()
    sync.state.transport.close()
    result["sync_buckets"] = len(sync.buckets)

    with open(args.out, "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
