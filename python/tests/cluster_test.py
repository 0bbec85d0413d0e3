"""A local cluster of real gcomp_server shards, and (with the Client built) push-pull from
Python: every worker gets the mean, exactly for lossless."""
import json
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


def test_config_path_names_the_config_before_start(tmp_path):
    """A launcher hands config_path to its workers; it names the config once constructed,
    and start() writes changes made to `config` meanwhile."""
    needs_server()
    c = cluster.LocalCluster(shards=1, workers=1, mode="lossless", workdir=str(tmp_path))
    with open(c.config_path) as f:
        assert json.load(f)["shards"] == c.addresses
    c.config["step_timeout_ms"] = 4321
    with c:
        assert cluster.read_config(c.config_path)["step_timeout_ms"] == 4321


def test_a_port_taken_before_the_shard_listens_is_replaced(tmp_path):
    needs_server()
    import socket
    c = cluster.LocalCluster(shards=2, workers=1, mode="lossless", workdir=str(tmp_path))
    taken = c.addresses[1]
    # Bound without listening: a shard cannot listen there, and nothing answers a connect.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", int(taken.rsplit(":", 1)[1])))
        with c:
            assert taken not in c.addresses and len(c.addresses) == 2
            with open(c.config_path) as f:
                assert json.load(f)["shards"] == c.addresses
            assert all(p.poll() is None for p in c.procs)


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


def test_connected_clients_take_torch_tensors(tmp_path):
    """gcomp.cluster.connect's Client takes CPU tensors where it takes numpy arrays (it
    answered a tensor with pybind's "incompatible function arguments")."""
    needs_server()
    needs_client()
    torch = pytest.importorskip("torch")
    with cluster.LocalCluster(shards=1, workers=1, mode="lossless",
                              workdir=str(tmp_path)) as c:
        client = cluster.connect(c.config_path, 0)
        x = torch.arange(1000, dtype=torch.float32)
        client.declare("t", 1000)
        got = torch.zeros(1000)
        client.push_pull("t", 0, x.clone(), got)
        assert torch.equal(got, x)
        inplace = x.clone()
        client.push_pull("t", 1, inplace)
        assert torch.equal(inplace, x)
        pulled = torch.zeros(1000)
        client.pull("t", pulled)
        assert torch.equal(pulled, x)
        with pytest.raises(ValueError, match="contiguous"):
            client.push_pull("t", 2, x.clone(), torch.zeros(2000)[::2])
        client.close()


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
    line = 'gcomp_worker_raw_bytes_total{gcomp_job="%s",worker="0",direction="sent"} %d' % (
        c.config["job"], stats["raw_bytes_sent"])
    assert line in text
    assert stats["raw_bytes_sent"] == n * 4


def test_training_goes_on_across_a_live_reshard_from_the_config_file(tmp_path):
    """The Kubernetes way: the config file the shards run from is rewritten with a third
    shard and a higher epoch, the added shard starts with it, shard 0 coordinates, and the
    Python workers follow by themselves; every step's result stays the exact mean."""
    needs_server()
    needs_client()
    import json
    import os
    import subprocess
    import time
    workers, n, steps = 2, 20_000, 60
    with cluster.LocalCluster(shards=2, workers=workers, mode="lossless", chunk_bytes=4096,
                              workdir=str(tmp_path)) as c:
        clients = [cluster.connect(c.config_path, w) for w in range(workers)]
        wrong, errors = [], []
        progress = [0]

        def grad(w, step):
            return (np.sin(np.arange(n, dtype=np.float32) * (w + 1) + step) * 1e-3).astype(np.float32)

        def work(w):
            try:
                clients[w].declare("g", n)
                for step in range(steps):
                    out = grad(w, step)
                    clients[w].push_pull("g", step, out)
                    expected = (grad(0, step) + grad(1, step)) / np.float32(workers)
                    if np.abs(out.astype(np.float64) - expected).max() > 1e-9:
                        wrong.append((w, step))
                    if w == 0:
                        progress[0] = step
                    time.sleep(0.05)
            except Exception as e:  # reported below, with the shard logs
                errors.append(repr(e))

        threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        while progress[0] < 3 and all(t.is_alive() for t in threads):
            time.sleep(0.01)
        added = "127.0.0.1:%d" % cluster._free_ports(1)[0]
        new = dict(c.config, shards=c.addresses + [added], shard_map_epoch=2)
        tmp = c.config_path + ".new"
        with open(tmp, "w") as f:
            json.dump(new, f)
        os.replace(tmp, c.config_path)  # as the kubelet swaps a ConfigMap: all at once
        log = open(os.path.join(str(tmp_path), "shard2.log"), "w")
        third = subprocess.Popen([cluster.server_binary(), "--config", c.config_path, "--shard", "2",
                                  "--metrics_address", "127.0.0.1:0"], stdout=log,
                                 stderr=subprocess.STDOUT)
        try:
            for t in threads:
                t.join()
            stats = [cl.stats() for cl in clients]
            for cl in clients:
                cl.close()
        finally:
            third.terminate()
            third.wait(timeout=10)
        logs = "".join(open(os.path.join(str(tmp_path), "shard%d.log" % k)).read() for k in range(3))
    assert not errors, (errors, logs[-3000:])
    assert not wrong, wrong
    # Both workers moved to the new map once: the re-shard happened while they trained.
    assert all(s["map_switches"] == 1 for s in stats), (stats, logs[-3000:])


def test_client_transport_error_feedback_follows_the_cluster_config(tmp_path):
    """ClientTransport(cluster.connect(...)) with no policy quantizes as the config's uplink
    does, chunk by chunk: with one worker and a raw downlink, what comes back is exactly
    what quantize() said the shards received (so the error-feedback residual is exact)."""
    needs_client()
    torch = pytest.importorskip("torch")
    from gcomp import comm
    n = 10_000  # 2.4 chunks of 16 KiB
    c = cluster.LocalCluster(shards=2, workers=1, mode="near-lossless", rel_bits=2,
                             workdir=str(tmp_path), chunk_bytes=16384)
    c.config["downlink"] = {"mode": "none"}
    with c:
        transport = comm.ClientTransport(cluster.connect(c.config_path, 0))
        assert transport.policy == gcomp.codec.Policy("near-lossless", 2, -16)
        assert transport.chunk_bytes == 16384
        g = torch.Generator().manual_seed(3)
        x = torch.randn(n, generator=g) * torch.logspace(-3, 1, n)
        pushed = transport.quantize(x)
        assert not torch.equal(pushed, x)  # R = 2 keeps 2 mantissa bits: the residual is real
        assert (pushed - x).norm() <= 0.25 * x.norm()
        # The same policy given explicitly: still cut into the config's chunks (it once made
        # one block of the whole tensor, and training with error feedback drifted from the
        # gloo transport's from the second step).
        explicit = comm.ClientTransport(transport.client, gcomp.codec.Policy("near-lossless", 2))
        assert torch.equal(explicit.quantize(x), pushed)
        got = x.clone()
        transport.push_pull("g", 0, got)
        assert torch.equal(got, pushed)
        transport.close()


def test_a_restarted_worker_goes_on_from_the_shards_step(tmp_path):
    """The hook's first push of a key asks the shards where it is: a worker (or whole job)
    that restarts on shards that kept running goes on from there instead of being refused
    as stale, and gets the right results."""
    needs_server()
    needs_client()
    torch = pytest.importorskip("torch")
    from gcomp import comm
    from gcomp import torch as gtorch
    with cluster.LocalCluster(shards=2, workers=1, mode="lossless",
                              workdir=str(tmp_path), chunk_bytes=4096) as c:
        x = torch.arange(3000, dtype=torch.float32)  # 3 chunks
        for run, steps in ((0, 3), (1, 2)):
            transport = comm.ClientTransport(cluster.connect(c.config_path, 0))
            state = gtorch.PSHookState(transport)
            for _ in range(steps):
                flat = x.clone()
                state.submit("ddp/bucket0/3000", flat).wait()
                assert torch.equal(flat, x)  # one worker, lossless: its own gradient
            assert state._steps == {"ddp/bucket0/3000": 3 if run == 0 else 5}
            state.close()
            transport.close()
        # A fresh key starts at 0.
        transport = comm.ClientTransport(cluster.connect(c.config_path, 0))
        assert transport.first_step("other", x) == 0
        assert transport.first_step("ddp/bucket0/3000", x) == 5
        transport.close()


def test_a_worker_restored_from_its_own_state_names_its_step(tmp_path):
    """Worker 1 dies after its push of step 3 reached the shards; the step completes with
    worker 0. A new process restored from worker 1's state of before step 3 passes
    start_step=3: its push of step 3 gets the step's result (the shards hold it), and step 4
    lines up with worker 0's. Without start_step it would have pushed its step-3 gradient
    as step 4 (the shards' next step), averaged with worker 0's step 4."""
    needs_server()
    needs_client()
    torch = pytest.importorskip("torch")
    from concurrent.futures import ThreadPoolExecutor
    from gcomp import comm
    from gcomp import torch as gtorch
    key = "ddp/bucket0/3000"
    grad = lambda w, step: torch.full((3000,), float(10 * step + w))
    with cluster.LocalCluster(shards=2, workers=2, mode="lossless", workdir=str(tmp_path),
                              chunk_bytes=4096) as c, ThreadPoolExecutor(2) as pool:
        transports = [comm.ClientTransport(cluster.connect(c.config_path, w)) for w in (0, 1)]
        states = [gtorch.PSHookState(t) for t in transports]

        def step_all(step, workers):
            flats = {w: grad(w, step) for w in workers}
            list(pool.map(lambda w: states[w].submit(key, flats[w]).wait(), workers))
            return flats

        for step in range(4):
            out = step_all(step, (0, 1))
            assert torch.equal(out[0], torch.full((3000,), 10 * step + 0.5))
        states[1].close()
        transports[1].close()  # worker 1 is gone, its step-3 result with it
        restarted = comm.ClientTransport(cluster.connect(c.config_path, 1))
        assert restarted.first_step(key, grad(1, 3)) == 4  # the shards completed step 3
        states[1] = gtorch.PSHookState(restarted, start_step=3)
        flat = grad(1, 3)
        states[1].submit(key, flat).wait()
        assert torch.equal(flat, torch.full((3000,), 30.5))  # step 3's mean, as worker 0 got
        out = step_all(4, (0, 1))
        assert torch.equal(out[0], out[1]) and torch.equal(out[0], torch.full((3000,), 40.5))
        # A state two steps behind the shards cannot be served: refused, naming both steps.
        late = gtorch.PSHookState(comm.ClientTransport(cluster.connect(c.config_path, 1)),
                                  start_step=3)
        with pytest.raises(ValueError, match=r"starts at step 3 \(start_step\) but the shards "
                                             r"expect step 5 \(they completed step 4\)"):
            late.next_step(key, grad(1, 5))
        with pytest.raises(ValueError, match=r"start_step must be at least 0"):
            gtorch.PSHookState(restarted, start_step=-1)
        for st in states + [late]:
            st.close()
        for t in transports[:1] + [restarted, late.transport]:
            t.close()


def test_a_worker_whose_step_timed_out_meets_a_late_one_by_pushing_again(tmp_path):
    """Worker 1 is late for step 1: worker 0's push times out on the shards, and it pushes
    the step again at once. It used to count on to step 2 (refused as a future step for
    good); now its push meets worker 1's late one, and every step gives both the mean."""
    needs_server()
    needs_client()
    torch = pytest.importorskip("torch")
    from gcomp import comm
    from gcomp import torch as gtorch
    with cluster.LocalCluster(shards=2, workers=2, mode="lossless", workdir=str(tmp_path),
                              chunk_bytes=4096, step_timeout_ms=1000) as c:
        results, errors = {}, {}

        def worker(w):
            transport = comm.ClientTransport(cluster.connect(c.config_path, w))
            state = gtorch.PSHookState(transport)
            try:
                for step in range(3):
                    if w == 1 and step == 1:
                        threading.Event().wait(2.5)  # a straggler: past the step timeout
                    for attempt in range(8):
                        flat = torch.full((3000,), float(w + 1 + step))  # 3 chunks
                        try:
                            state.submit("ddp/bucket0/3000", flat).wait()
                            results[(w, step)] = flat
                            break
                        except Exception as e:  # pylint: disable=broad-except
                            errors.setdefault(w, []).append(str(e))
            finally:
                state.close()
                transport.close()

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for w in range(2):
            for step in range(3):
                assert (w, step) in results, (w, step, errors)
                assert torch.equal(results[(w, step)], torch.full((3000,), 1.5 + step))
        # Worker 0's first push of step 1 timed out, naming worker 1; no push was refused
        # as a future step.
        assert any("missing workers" in e and "step 1" in e for e in errors.get(0, [])), errors
        assert not any("future step" in e for es in errors.values() for e in es), errors
        assert 1 not in errors, errors


def test_local_cluster_takes_further_config_fields(tmp_path):
    needs_server()
    c = cluster.LocalCluster(shards=1, workers=1, mode="lossless", workdir=str(tmp_path),
                             downlink={"mode": "none"}, max_inflight_chunks=3)
    with c:
        config = cluster.read_config(c.config_path)
        assert config["downlink"]["mode"] == "none"
        assert config["uplink"]["mode"] == "lossless"
        assert config["max_inflight_chunks"] == 3
    bad = cluster.LocalCluster(shards=1, workers=1, mode="lossless", workdir=str(tmp_path),
                               max_inflight_chunks=0)
    with pytest.raises(RuntimeError, match="max_inflight_chunks"):
        bad.start()


def start_second_worker0(config_path):
    """Starts another process that connects as worker 0, prints 'connected' and stays
    connected until its stdin closes."""
    import os
    import subprocess
    import sys
    script = ("import sys\nfrom gcomp import cluster\n"
              "c = cluster.connect(sys.argv[1], 0)\nprint('connected', flush=True)\n"
              "sys.stdin.read()\nc.close()\n")
    return subprocess.Popen([sys.executable, "-c", script, config_path],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))


def test_a_second_process_with_the_same_worker_index_is_refused(tmp_path):
    """Two processes connected as worker 0 (a repeated rank): the one that connected first
    gets a RuntimeError naming the index at its next push, not a silent drop."""
    needs_server()
    needs_client()
    with cluster.LocalCluster(shards=1, workers=2, mode="lossless",
                              workdir=str(tmp_path), step_timeout_ms=20000) as c:
        first = cluster.connect(c.config_path, 0)
        first.declare("g", 1000)
        second = start_second_worker0(c.config_path)
        try:
            assert second.stdout.readline().strip() == "connected"
            with pytest.raises(RuntimeError, match="another process registered as worker 0"):
                first.push_pull("g", 0, np.ones(1000, dtype=np.float32))
        finally:
            second.stdin.close()
            assert second.wait(timeout=30) == 0
            first.close()


def test_a_push_waiting_when_a_second_process_takes_its_index_is_refused(tmp_path):
    """The same, with the first process already waiting in push_pull for worker 1 when the
    second connects: its push_pull raises at once, not after the step timeout."""
    needs_server()
    needs_client()
    import threading
    import time
    with cluster.LocalCluster(shards=1, workers=2, mode="lossless",
                              workdir=str(tmp_path), step_timeout_ms=60000) as c:
        first = cluster.connect(c.config_path, 0)
        first.declare("g", 1000)
        outcome = {}

        def push():
            start = time.monotonic()
            try:
                first.push_pull("g", 0, np.ones(1000, dtype=np.float32))
                outcome["error"] = None
            except RuntimeError as e:
                outcome["error"] = str(e)
            outcome["seconds"] = time.monotonic() - start

        waiting = threading.Thread(target=push)
        waiting.start()
        time.sleep(0.5)
        assert waiting.is_alive()  # waiting for worker 1
        second = start_second_worker0(c.config_path)
        try:
            assert second.stdout.readline().strip() == "connected"
            waiting.join(timeout=30)
            assert not waiting.is_alive()
            assert outcome["error"] is not None
            assert "another process registered as worker 0" in outcome["error"]
            assert outcome["seconds"] < 30  # the step timeout is 60 s
        finally:
            second.stdin.close()
            assert second.wait(timeout=30) == 0
            first.close()


def test_closing_a_client_while_another_thread_pushes_is_safe(tmp_path):
    """close() on one thread while another starts a push-pull (a script cleaning up after
    backward raised, while the hook's thread still pushes a bucket): the push finishes or
    raises that the Client is closed; the process never crashes (it once freed the Client
    under the running call). In a child process, so that a crash fails only this test."""
    import os
    import subprocess
    import sys
    needs_server()
    needs_client()
    script = """
import sys, threading, time
import numpy as np
from gcomp import cluster
outcomes = {"done": 0, "closed": 0}
for trial in range(40):
    client = cluster.connect(sys.argv[1], 0)
    key = "k%d" % trial
    buf = np.ones(1000, np.float32)
    client.declare(key, buf.size)
    go = threading.Event()
    def push():
        go.wait()
        try:
            client.push_pull(key, 0, buf)
            outcomes["done"] += 1
        except RuntimeError as e:
            assert "closed" in str(e), e
            outcomes["closed"] += 1
    t = threading.Thread(target=push)
    t.start()
    go.set()
    time.sleep(0.0005 * (trial % 5))
    client.close()
    t.join()
print(outcomes["done"], outcomes["closed"])
"""
    with cluster.LocalCluster(shards=1, workers=1, mode="lossless", workdir=str(tmp_path)) as c:
        run = subprocess.run([sys.executable, "-c", script, c.config_path], capture_output=True,
                             text=True, timeout=300,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert run.returncode == 0, run.stdout + run.stderr
    done, closed = map(int, run.stdout.split())
    assert done + closed == 40


def test_shards_stop_when_the_process_that_started_them_dies(tmp_path):
    """A script holding a LocalCluster that dies of a signal (no __exit__) leaves no shard
    process behind: they shut down when their parent is gone."""
    import os
    import signal
    import subprocess
    import sys
    import time
    needs_server()
    script = """
import os, signal, sys
from gcomp import cluster
c = cluster.LocalCluster(shards=2, workers=1, mode="none", workdir=sys.argv[1])
c.start()
print(" ".join(str(p.pid) for p in c.procs), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert run.returncode == -signal.SIGKILL, run.stdout + run.stderr
    pids = [int(p) for p in run.stdout.split()]
    assert len(pids) == 2
    deadline = time.time() + 30
    alive = pids
    while alive and time.time() < deadline:
        time.sleep(0.2)
        alive = [p for p in pids if os.path.exists("/proc/%d" % p)
                 and "zombie" not in open("/proc/%d/status" % p).read()]
    for p in alive:  # do not leave them running when the test fails
        os.kill(p, signal.SIGKILL)
    assert not alive, "shards %s outlived the process that started them" % alive


def test_a_second_close_waits_for_the_first(tmp_path):
    """Two threads close one Client while a push waits for a worker that never comes: both
    close() calls return only once the push has ended (the second once returned at once,
    with the connections still open)."""
    import time
    needs_server()
    needs_client()
    with cluster.LocalCluster(shards=1, workers=2, mode="lossless", workdir=str(tmp_path),
                              step_timeout_ms=3000) as c:
        client = cluster.connect(c.config_path, 0)
        client.declare("g", 1000)
        ended = {}

        def push():
            with pytest.raises(TimeoutError, match="DEADLINE_EXCEEDED"):
                client.push_pull("g", 0, np.ones(1000, dtype=np.float32))
            ended["push"] = time.monotonic()

        def close_first():
            client.close()
            ended["first close"] = time.monotonic()

        pusher = threading.Thread(target=push)
        pusher.start()
        time.sleep(0.5)
        first = threading.Thread(target=close_first)
        first.start()
        time.sleep(0.5)
        client.close()
        ended["second close"] = time.monotonic()
        pusher.join()
        first.join()
        assert ended["second close"] >= ended["push"] - 0.05, ended
        assert ended["first close"] >= ended["push"] - 0.05, ended


def test_a_refused_redeclaration_keeps_the_key_as_it_was(tmp_path):
    """A re-declaration the shards refuse (another dtype) leaves the Client's size for the
    key unchanged: buffers of the declared size still go, others are refused, and none is
    read or written past its end."""
    needs_server()
    needs_client()
    with cluster.LocalCluster(shards=1, workers=1, mode="lossless",
                              workdir=str(tmp_path)) as c:
        client = cluster.connect(c.config_path, 0)
        client.declare("w", 4, "f32")
        with pytest.raises(Exception, match=r"ALREADY_EXISTS.*f32 x 4"):
            client.declare("w", 4, "bf16")
        big = np.full(8, -7.0, dtype=np.float32)
        with pytest.raises(ValueError, match=r"key 'w' holds 16 bytes, buffer has 8"):
            client.push_pull("w", 0, big[:2])
        assert (big == -7.0).all()
        # An f16 buffer of the same byte count is not 8 f32 halves.
        with pytest.raises(ValueError, match=r"holds f32 elements of 4 bytes; the buffer's "
                                             r"elements have 2"):
            client.push_pull("w", 0, np.zeros(8, dtype=np.float16))
        # Integers of the same width are not float32 values (their bits would be taken).
        for ints in (np.array([1, 2, 3, 4], np.int32), np.array([1, 2, 3, 4], np.uint32)):
            with pytest.raises(ValueError, match=r"holds f32 elements; the buffer's are of "
                                                 r"format '.?[iIlL]' \(pass float32"):
                client.push_pull("w", 0, ints)
        with pytest.raises(ValueError, match=r"format '>f'"):
            client.push_pull("w", 0, np.arange(4, dtype=">f4"))
        grad = np.arange(4, dtype=np.float32)
        client.push_pull("w", 0, grad)
        assert (grad == np.arange(4, dtype=np.float32)).all()
        # Raw bytes have no element width: taken by their size.
        raw = bytearray(np.arange(4, dtype=np.float32).tobytes())
        client.push_pull("w", 1, raw)
        # Read-only data without `out`: the result has nowhere to go, and the error says so.
        with pytest.raises(TypeError, match=r"data is read-only .* written back into data"):
            client.push_pull("w", 2, bytes(raw))
        got = np.zeros(4, np.float32)
        client.push_pull("w", 2, bytes(raw), got)
        assert (got == np.arange(4, dtype=np.float32)).all()
        with pytest.raises(ValueError, match=r"elements must be in \[1, 2\^36\], got 0"):
            client.declare("empty", 0, "f32")
        with pytest.raises(ValueError, match=r"elements must be in \[1, 2\^36\]"):
            client.declare("huge", 2 ** 62, "f32")
        client.close()


def test_connecting_in_a_child_forked_after_connect_is_refused(tmp_path):
    """gRPC does not survive fork(): a child forked after its parent connected hung in
    connect or in a push; it now gets an error naming the start methods that work."""
    import multiprocessing
    needs_server()
    needs_client()
    with cluster.LocalCluster(shards=1, workers=2, mode="none", workdir=str(tmp_path)) as c:
        parent = cluster.connect(c.config_path, 0)
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()

        def child():
            try:
                cluster.connect(c.config_path, 1)
                queue.put("connected")
            except RuntimeError as e:
                queue.put(str(e))

        proc = ctx.Process(target=child)
        proc.start()
        message = queue.get(timeout=60)
        proc.join(timeout=60)
        parent.close()
    assert "forked from process" in message and "'spawn'" in message, message
