"""One process of hook_test's error case: a step through a real shard, the shard stopped,
then DDP's backward and GradientSync.sync() again. Prints what each raised, one JSON line."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import gcomp.torch as gtorch  # noqa: E402
from gcomp import cluster, comm  # noqa: E402


def raised(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test reads what was raised
        return {"type": type(e).__name__, "message": str(e)}
    return None


def main():
    workdir = sys.argv[1]
    dist.init_process_group("gloo", init_method="file://" + os.path.join(workdir, "process-group"),
                            rank=0, world_size=1)
    c = cluster.LocalCluster(shards=1, workers=1, mode="near-lossless", workdir=workdir)
    c.start()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 4))
    state = gtorch.PSHookState(comm.ClientTransport(cluster.connect(c.config_path, 0)))
    model.register_comm_hook(state, gtorch.ps_hook)
    plain = torch.nn.Linear(8, 4)
    sync = gtorch.GradientSync(plain, comm.ClientTransport(cluster.connect(c.config_path, 0)))
    x = torch.ones(3, 8)

    def ddp_step():
        model(x).sum().backward()

    def sync_step():
        plain(x).sum().backward()
        sync.sync()

    before = [raised(ddp_step), raised(sync_step)]
    c.stop()
    after = [raised(ddp_step), raised(sync_step)]
    # An error raised in the hook itself (a closed state), two steps running: each step
    # names it (raised from the hook, it once left DDP's reducer broken for the next one).
    state.close()
    closed = [raised(ddp_step), raised(ddp_step)]
    print(json.dumps({"before": before, "after": after, "closed": closed}))


if __name__ == "__main__":
    main()
