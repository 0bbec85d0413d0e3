"""CUDA gradients: with ClientTransport the worker Client pushes them with the GPU codec;
other transports and machines without a usable device refuse them in one line naming the
fix. The device test runs where torch has CUDA and the Client finds a device."""
import pytest
import torch

import gcomp
from gcomp import comm
import gcomp.torch as gtorch


def test_transports_name_why_they_cannot_take_cuda_tensors():
    why = comm.Transport().cuda_unsupported()
    assert "CPU tensors only" in why and "ClientTransport" in why
    if not gcomp.have_extension():
        pytest.skip(gcomp.extension_error())
    status = gcomp.extension().cuda_status()
    client_why = comm.ClientTransport(client=None).cuda_unsupported()
    if status:
        assert status in client_why and "move the model to the CPU" in client_why
    else:
        assert client_why is None


def test_other_devices_are_refused_naming_the_device():
    with pytest.raises(TypeError, match="meta gradients are not supported"):
        gtorch.check_tensor(torch.empty(4, device="meta"), "ps_hook", comm.Transport())
    with pytest.raises(TypeError, match="torch.int32 gradients are not supported"):
        gtorch.check_tensor(torch.zeros(4, dtype=torch.int32), "ps_hook", comm.Transport())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_push_pull_matches_the_cpu_path(dtype, tmp_path):
    """One worker, two shards: the mean is the worker's own gradient after the codec both
    ways. The GPU codec writes the same blocks as the CPU codec, so a CUDA tensor comes
    back bit-identical to the same values pushed from the CPU."""
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device here")
    if not gcomp.have_extension() or gcomp.extension().cuda_status():
        pytest.skip(gcomp.extension_error() or gcomp.extension().cuda_status())
    from gcomp import cluster
    why = cluster.server_missing()
    if why:
        pytest.skip(why)
    with cluster.LocalCluster(shards=2, workers=1, mode="near-lossless",
                              workdir=str(tmp_path)) as c:
        transport = comm.ClientTransport(cluster.connect(c.config_path, 0))
        g = torch.Generator().manual_seed(3)
        host = (torch.randn(300_001, generator=g) * 0.01).to(dtype)
        device = host.to("cuda")
        for step in range(2):
            transport.push_pull("cpu", step, host)
            transport.push_pull("gpu", step, device)
            assert torch.equal(device.cpu(), host), step
        transport.close()
