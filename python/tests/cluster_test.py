"""A local cluster of real gcomp_server shards, and (with the Client built) push-pull from
Python: every worker gets the mean, exactly for lossless."""
import threading

import numpy as np
import pytest

import gcomp
from gcomp import cluster


def needs_server():
    why = cluster.server_missing()
    if why:
        pytest.skip(why)


def needs_client():
    if not gcomp.have_extension():
        pytest.skip(gcomp.extension_error())
    if not getattr(gcomp.extension(), "HAS_CLIENT", False):
        pytest.skip("the extension was built without the worker Client")


def test_shards_start_and_stop(tmp_path):
    needs_server()
    c = cluster.LocalCluster(shards=2, workers=1, mode="lossless", workdir=str(tmp_path))
    with c:
        assert all(p.poll() is None for p in c.procs)
    assert c.procs == []


def test_bad_config_fails_with_the_shards_message(tmp_path):
    needs_server()
    c = cluster.LocalCluster(shards=1, workers=1, mode="lossless", workdir=str(tmp_path),
                             step_timeout_ms=0)
    with pytest.raises(RuntimeError, match="step_timeout_ms"):
        c.start()


@pytest.mark.parametrize("mode", ["none", "lossless", "near-lossless"])
def test_push_pull_from_python_gives_every_worker_the_mean(mode, tmp_path):
    needs_server()
    needs_client()
    workers, n = 3, 300_000
    rng = np.random.default_rng(0)
    grads = [(rng.standard_normal(n) * 1e-3).astype(np.float32) for _ in range(workers)]
    expected = grads[0].copy()
    for g in grads[1:]:
        expected += g
    expected /= workers
    with cluster.LocalCluster(shards=2, workers=workers, mode=mode,
                              workdir=str(tmp_path)) as c:
        clients = [cluster.connect(c.config_path, w) for w in range(workers)]
        outs = [g.copy() for g in grads]

        def work(w):
            clients[w].declare("g", n)
            for step in range(2):
                outs[w][:] = grads[w]
                clients[w].push_pull("g", step, outs[w])

        threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = clients[0].stats()
        for cl in clients:
            cl.close()
    for o in outs[1:]:
        assert np.array_equal(o, outs[0])  # every worker got the same bytes back
    err = np.abs(outs[0].astype(np.float64) - expected).max()
    if mode == "near-lossless":
        assert err <= 2.0 ** -7 * np.abs(expected).max()
        assert stats["raw_bytes_sent"] / stats["wire_bytes_sent"] > 2
    else:
        assert err <= 1e-9  # the shards' summation order may differ from ours by rounding


def test_python_client_serves_prometheus_metrics(tmp_path):
    needs_server()
    needs_client()
    import urllib.request
    n = 50_000
    with cluster.LocalCluster(shards=1, workers=1, mode="near-lossless",
                              workdir=str(tmp_path)) as c:
        client = cluster.connect(c.config_path, 0, metrics_address="127.0.0.1:0")
        port = client.metrics_port()
        assert port > 0
        g = np.full(n, 0.5, dtype=np.float32)
        client.declare("g", n)
        client.push_pull("g", 0, g)
        stats = client.stats()
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
        client.close()
    line = 'gcomp_worker_raw_bytes_total{job="%s",worker="0",direction="sent"} %d' % (
        c.config["job"], stats["raw_bytes_sent"])
    assert line in text
    assert stats["raw_bytes_sent"] == n * 4
