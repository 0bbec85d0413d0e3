"""One rank of ddp_options_test: DDP with gcomp.torch.ps_hook under one non-default DDP
setting, checked step by step against the mean of every rank's own gradients."""
import argparse
import faulthandler
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import gcomp.torch as gtorch  # noqa: E402
from gcomp import comm  # noqa: E402
from hook_worker import finish  # noqa: E402  (this folder is on sys.path: the script's own)


class TwoHeads(nn.Module):
    """A trunk and two heads; odd steps use only head `a`, so with
    find_unused_parameters=True head `b` gets no gradient on those steps."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        # 2.3 MB of parameters: more than DDP's first bucket (1 MiB), so the other buckets
        # are cut at bucket_cap_mb.
        self.trunk = nn.Sequential(nn.Linear(32, 1024), nn.ReLU(), nn.Linear(1024, 512),
                                   nn.ReLU())
        self.a = nn.Linear(512, 10)
        self.b = nn.Linear(512, 10)

    def forward(self, x, step):
        h = self.trunk(x)
        return self.a(h) if step % 2 else self.a(h) + self.b(h)


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


def flat_grads(model):
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in model.parameters()])


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--rank", type=int)
    a.add_argument("--world", type=int)
    a.add_argument("--init-method")
    a.add_argument("--option")
    a.add_argument("--out")
    args = a.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=args.init_method,
                            rank=args.rank, world_size=args.world)
    kwargs = {"bucket_cap_mb": 0.1}  # several buckets in every variant
    if args.option == "gradient_as_bucket_view":
        kwargs["gradient_as_bucket_view"] = True
    elif args.option == "find_unused_parameters":
        kwargs["find_unused_parameters"] = True
    elif args.option == "large_buckets":
        kwargs["bucket_cap_mb"] = 25
    model, plain = TwoHeads(), TwoHeads()
    ddp = DDP(model, **kwargs)
    state = gtorch.PSHookState(comm.GlooTransport("lossless"))
    ddp.register_comm_hook(state, gtorch.ps_hook)
    unused_steps = args.option == "find_unused_parameters"
    result = {"max_err": [], "keys_per_step": []}
    for step in range(4):
        x, y = batch(args.rank, step)
        plain.load_state_dict(model.state_dict())
        plain.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(plain(x, step if unused_steps else 0), y).backward()
        mine = flat_grads(plain)
        parts = [torch.empty_like(mine) for _ in range(args.world)]
        dist.all_gather(parts, mine)
        ref = sum(parts[1:], parts[0].clone()) / args.world
        model.zero_grad(set_to_none=False)
        before = set(state._steps)
        nn.functional.cross_entropy(ddp(x, step if unused_steps else 0), y).backward()
        result["keys_per_step"].append(len(set(state._steps)) - len(before))
        result["max_err"].append(float((flat_grads(model) - ref).abs().max()))
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= 0.05 * p.grad
    state.close()
    result["keys"] = sorted(state._steps)
    result["rebuilt"] = getattr(ddp, "_has_rebuilt_buckets", None)  # torch 1.13's flag
    finish(result, args.out)


if __name__ == "__main__":
    main()
