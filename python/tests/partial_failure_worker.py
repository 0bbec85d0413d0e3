"""One rank of partial_failure_test: DDP with several buckets through the shards; with
--delay, rank 1's first layer's gradient comes late past step_timeout_ms at one step, so on
rank 0 the earlier buckets complete and a later one fails. Rank 0 catches the error and runs
the batch again, as python/README.md says. Writes the final parameters' values."""
import argparse
import faulthandler
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import gcomp.torch as gtorch  # noqa: E402
from gcomp import cluster, comm  # noqa: E402
from hook_worker import finish  # noqa: E402  (this folder is on sys.path: the script's own)

STEPS, LATE_STEP = 6, 2


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--rank", type=int)
    a.add_argument("--init-method")
    a.add_argument("--cluster-config")
    a.add_argument("--prefix")
    a.add_argument("--late-s", type=float, default=0.0)
    a.add_argument("--out")
    args = a.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=args.init_method, rank=args.rank,
                            world_size=2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    ddp = DDP(model, bucket_cap_mb=0.1)  # several buckets: the first layer's is the last
    state = gtorch.PSHookState(comm.ClientTransport(cluster.connect(args.cluster_config,
                                                                    args.rank)),
                               prefix=args.prefix)
    ddp.register_comm_hook(state, gtorch.ps_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    now = [0]

    def late(grad):
        if args.rank == 1 and now[0] == LATE_STEP and args.late_s > 0:
            time.sleep(args.late_s)
        return grad

    model[0].weight.register_hook(late)
    errors = []
    for step in range(STEPS):
        now[0] = step
        g = torch.Generator().manual_seed(100 * args.rank + step)
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
        for attempt in range(3):
            opt.zero_grad()
            try:
                nn.functional.cross_entropy(ddp(x), y).backward()
                break
            except RuntimeError as e:
                errors.append("step %d attempt %d: %s" % (step, attempt, str(e)[:300]))
        opt.step()
    state.close()
    finish({"params": [p.detach().reshape(-1).tolist() for p in model.parameters()],
            "errors": errors}, args.out)


if __name__ == "__main__":
    main()
