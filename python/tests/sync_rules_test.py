"""Rules of gcomp.torch's key naming and GradientSync, with an in-process transport that
plays the other workers (no shards): a second model on the same keys is refused, gradients
that are None follow DDP's rules, the synced set follows requires_grad, sparse gradients
are refused; and GlooTransport (a one-rank gloo group) cuts chunks as the Client does."""
import os
import tempfile
import threading
import time

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from gcomp import codec, comm  # noqa: E402
from gcomp import torch as gtorch  # noqa: E402


class TwoWorkers(comm.Transport):
    """The mean with one more worker whose gradient is `other(key)` (zeros by default,
    and a 1 flag for every parameter under "used" keys when `other_used` is set)."""

    def __init__(self, other_used=None):
        super().__init__()
        self.keys = []
        self.other_used = other_used

    def push_pull(self, key, step, tensor):
        self.keys.append((key, step))
        other = torch.zeros_like(tensor)
        if "/used/" in key and self.other_used is not None:
            other = torch.tensor(self.other_used, dtype=tensor.dtype)
        tensor.copy_((tensor + other) / 2)


def test_two_states_on_one_key_are_refused():
    transport = TwoWorkers()
    a = gtorch.PSHookState(transport)
    b = gtorch.PSHookState(transport)
    a.submit("ddp/bucket0/4", torch.ones(4)).wait()
    with pytest.raises(ValueError, match=r"already pushed .* close\(\) it first; .* own "
                                         r"prefix .* PSHookState\(transport, prefix='ddp2'\)"):
        b.submit("ddp/bucket0/4", torch.ones(4))
    # Another prefix is another key; the same state may push its key again.
    c = gtorch.PSHookState(transport, prefix="critic")
    c.submit("critic/bucket0/4", torch.ones(4)).wait()
    a.submit("ddp/bucket0/4", torch.ones(4)).wait()
    # A closed state gives its keys up, and used again it says so without taking them
    # back (it used to re-claim the key, then fail in its thread pool).
    a.close()
    with pytest.raises(RuntimeError, match=r"GradientSync \(prefix 'ddp'\) is closed"):
        a.submit("ddp/bucket0/4", torch.ones(4))
    b.submit("ddp/bucket0/4", torch.ones(4)).wait()
    a.close()  # twice is harmless
    for s in (b, c):
        s.close()


def test_a_closed_gradient_sync_does_not_block_its_successor():
    transport = TwoWorkers()
    model = nn.Linear(3, 2)
    old = gtorch.GradientSync(model, transport)
    model(torch.ones(1, 3)).sum().backward()
    old.sync()
    old.close()
    with pytest.raises(RuntimeError, match="is closed"):
        old.sync()
    new = gtorch.GradientSync(model, transport)
    new.sync()
    new.close()


class FakeClient:
    """A worker Client's surface as ClientTransport uses it, moving nothing."""

    def __init__(self, worker, job="j"):
        self.worker = worker
        self.config = {"job": job, "shards": ["a:1", "b:2"], "chunk_bytes": 4096,
                       "uplink": {"mode": "none", "rel_bits": 7, "abs_log2": -16}}

    def declare(self, key, n, dtype):
        pass

    def push_pull(self, key, step, buf):
        pass

    def resume_step(self, key):
        return 0


def test_two_clients_of_one_worker_share_its_keys():
    # Two Client objects of worker 0 of one job push to the same shard state.
    a = gtorch.PSHookState(comm.ClientTransport(FakeClient(0)))
    b = gtorch.PSHookState(comm.ClientTransport(FakeClient(0)))
    a.submit("ddp/bucket0/4", torch.ones(4)).wait()
    with pytest.raises(ValueError, match="already pushed"):
        b.submit("ddp/bucket0/4", torch.ones(4))
    # Another worker, or another job, is another key space.
    for other in (FakeClient(1), FakeClient(0, job="k")):
        c = gtorch.PSHookState(comm.ClientTransport(other))
        c.submit("ddp/bucket0/4", torch.ones(4)).wait()
        c.close()
    for s in (a, b):
        s.close()


def test_what_cannot_carry_the_mean_gradient_is_refused_naming_the_fix():
    # A Client where a transport belongs, and anything else as the hook's state.
    from gcomp import cluster
    for wrong in (cluster.WorkerClient(FakeClient(0), FakeClient(0).config, 0), object()):
        with pytest.raises(TypeError, match=r"takes a transport, got .*ClientTransport\(client\)"):
            gtorch.PSHookState(wrong)
        # Named as the caller wrote it (it said PSHookState, which the script never named).
        with pytest.raises(TypeError, match=r"^GradientSync takes a transport, .*"
                                            r"GradientSync\(model, ClientTransport\("):
            gtorch.GradientSync(nn.Linear(2, 2), wrong)

    class Bucket:
        def buffer(self):
            return torch.ones(4)

        def index(self):
            return 0

    # The hook's errors come in its future (DDP's backward raises them), never from the
    # call itself, which would leave DDP's reducer broken for the next step.
    for state in (FakeClient(0), comm.ClientTransport(FakeClient(0))):
        fut = gtorch.ps_hook(state, Bucket())
        with pytest.raises(Exception, match=r"state must be a gcomp.torch.PSHookState, got "
                                            r".*register_comm_hook\(PSHookState\("):
            fut.wait()
    # Shards that run an optimizer answer with parameters, not the mean gradient.
    client = FakeClient(0)
    client.config["optimizer"] = {"name": "sgd", "learning_rate": 0.1}
    for make in (lambda t: gtorch.PSHookState(t), lambda t: gtorch.GradientSync(nn.Linear(2, 2), t)):
        with pytest.raises(ValueError, match=r"optimizer 'sgd'.* set optimizer: none"):
            make(comm.ClientTransport(client))
    client.config["optimizer"] = {"name": "none"}
    gtorch.PSHookState(comm.ClientTransport(client)).close()


def test_two_gradient_syncs_of_one_shape_are_refused():
    transport = TwoWorkers()
    m1, m2 = nn.Linear(3, 2), nn.Linear(3, 2)
    s1 = gtorch.GradientSync(m1, transport)
    s2 = gtorch.GradientSync(m2, transport)
    for m in (m1, m2):
        m(torch.ones(1, 3)).sum().backward()
    s1.sync()
    with pytest.raises(ValueError, match="already pushed"):
        s2.sync()
    s3 = gtorch.GradientSync(m2, transport, prefix="m2")
    s3.sync()
    for s in (s1, s2, s3):
        s.close()


def test_missing_gradients_are_an_error_unless_allowed():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
    sync = gtorch.GradientSync(model, TwoWorkers())
    model[0](torch.ones(1, 3)).sum().backward()  # model[1] gets no gradient
    with pytest.raises(ValueError, match=r"2 of the 4 parameters .* \(the first: 1.weight\).*"
                                         r"find_unused_parameters=True"):
        sync.sync()
    sync.close()


def test_unused_parameters_follow_ddp():
    # Parameter order: a.weight, a.bias, b.weight, b.bias. This worker trains only `a`; the
    # other worker trains `a` and b.weight.
    model = nn.ModuleDict({"a": nn.Linear(3, 2), "b": nn.Linear(2, 2)})
    transport = TwoWorkers(other_used=[1, 1, 1, 0])
    sync = gtorch.GradientSync(model, transport, find_unused_parameters=True)
    model["a"](torch.ones(1, 3)).sum().backward()
    mine = model["a"].weight.grad.clone()
    sync.sync()
    assert torch.equal(model["a"].weight.grad, mine / 2)
    # Used by the other worker only: the mean, this worker counted as zeros.
    assert model["b"].weight.grad is not None
    assert torch.count_nonzero(model["b"].weight.grad) == 0
    # Used by no worker: left None, so the optimizer leaves it alone.
    assert model["b"].bias.grad is None
    assert [k for k, _ in transport.keys] == ["grads/0/14", "grads/used/4"]
    sync.close()


def test_the_synced_parameters_follow_requires_grad():
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
    model[1].requires_grad_(False)
    transport = TwoWorkers()
    sync = gtorch.GradientSync(model, transport)

    def step():
        model.zero_grad(set_to_none=True)
        model(torch.ones(1, 3)).sum().backward()
        sync.sync()

    step()
    assert model[1].weight.grad is None
    # Unfrozen: synced from now on (a bucket of another size, a new key from step 0).
    model[1].requires_grad_(True)
    step()
    assert model[1].weight.grad is not None
    # Frozen again: no longer synced, its gradient left as backward left it (None).
    model[0].requires_grad_(False)
    step()
    assert model[0].weight.grad is None
    assert transport.keys == [("grads/0/8", 0), ("grads/0/14", 0), ("grads/0/6", 0)]
    sync.close()


def test_sparse_gradients_are_refused_by_name():
    emb = nn.Embedding(10, 4, sparse=True)
    sync = gtorch.GradientSync(emb, TwoWorkers())
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(TypeError, match=r"torch.sparse_coo gradients are not supported .*"
                                        r"sparse=False"):
        sync.sync()
    sync.close()


def test_near_lossless_is_read_as_the_config_parser_reads_it():
    assert comm.policy_for("near_lossless").mode == "near-lossless"
    with pytest.raises(ValueError, match="mode must be one of"):
        comm.policy_for("fast")


def test_gloo_transport_cuts_chunks_as_the_client_does():
    try:
        codec.extension()
    except Exception as e:  # noqa: BLE001
        pytest.skip("the _gcomp extension is not built: %s" % e)
    import torch.distributed as dist
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "pg"),
                                rank=0, world_size=1)
        try:
            transport = comm.GlooTransport("near-lossless", chunk_bytes=4096)
            x = torch.randn(5000, generator=torch.Generator().manual_seed(3))
            got = x.clone()
            transport.push_pull("k", 0, got)
            # One worker: the chunks' round trip up, then the mean's round trip down.
            policy = comm.policy_for("near-lossless")
            up = comm._quantize_chunks(x, policy, 4096)
            assert torch.equal(got, comm._quantize_chunks(up, policy, 4096))
            # Bytes: each chunk's block (no frame headers), both ways.
            blocks = 0
            for y in (x, up):
                for lo in range(0, 5000, 1024):
                    frame = codec.encode(y[lo:lo + 1024], policy, 4096)
                    assert codec.extension().inspect_frame(frame)["blocks"] == 1
                    blocks += len(frame) - (24 + 4 + 8)
            assert transport.wire_bytes == blocks
            assert transport.raw_bytes == 2 * 4 * 5000
        finally:
            dist.destroy_process_group()


class Recording(comm.Transport):
    """One worker: the mean is what it pushed. Records each push (key, dtype, values) and
    quantizes to multiples of 1/4, so that error feedback keeps a residual."""

    def __init__(self):
        super().__init__()
        self.pushes = []

    def quantize(self, tensor):
        return torch.round(tensor.float() * 4) / 4

    def push_pull(self, key, step, tensor):
        self.pushes.append((key, tensor.dtype, tensor.detach().float().clone()))


def test_a_key_keeps_its_dtype_when_a_layer_of_another_is_frozen():
    # A bfloat16 block and a float32 block of the same size, one bucket each: freezing the
    # first renumbered the buckets, and the float32 one took the bfloat16 one's key.
    model = nn.Sequential(nn.Linear(8, 8).to(torch.bfloat16), nn.Linear(8, 8))
    transport = Recording()
    sync = gtorch.GradientSync(model, transport)
    x = torch.ones(1, 8)
    for freeze in (False, True):
        model[0].requires_grad_(not freeze)
        model.zero_grad(set_to_none=True)
        model[1](model[0](x.to(torch.bfloat16)).float()).sum().backward()
        sync.sync()
    dtypes = {}
    for key, dtype, _ in transport.pushes:
        assert dtypes.setdefault(key, dtype) == dtype, (key, dtypes[key], dtype)
    assert sorted(dtypes) == ["grads/0/72", "grads/0/72/bf16", "grads/1/72"]
    sync.close()


def test_error_feedback_follows_each_parameter_when_the_buckets_change():
    # Step 0 pushes [a, b] in one bucket; a is then frozen, and bucket 0 holds b alone.
    # b's residual must come back to b, not a's residual at b's new offsets.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    transport = Recording()
    sync = gtorch.GradientSync(model, transport, error_feedback=True)
    x = torch.randn(2, 4)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()
        grads = [p.grad.reshape(-1).clone() for p in model.parameters() if p.requires_grad]
        sync.sync()
        return grads

    a0, b0 = step()
    pushed0 = transport.pushes[-1][2]
    residual_b = (b0 - transport.quantize(b0))
    assert torch.equal(pushed0, torch.cat([a0, b0]))
    model[0].requires_grad_(False)
    (b1,) = step()
    key, _, pushed1 = transport.pushes[-1]
    assert key == "grads/0/16"
    assert torch.equal(pushed1, b1 + residual_b)
    assert torch.count_nonzero(residual_b) > 0
    sync.close()


def test_error_feedback_survives_a_bucket_split_in_either_order():
    # DDP's rebuild after step 0 can split one bucket [a, b] into [a] and [b], pushed
    # concurrently: whichever finished first dropped the old key's residuals, and the other
    # half lost its own (training then depended on thread timing).
    torch.manual_seed(0)
    a0, b0, a1, b1 = (torch.randn(6) for _ in range(4))
    q = Recording().quantize
    for order in (("a", "b"), ("b", "a")):
        transport = Recording()
        state = gtorch.PSHookState(transport, error_feedback=True)
        state.sync("k/12", 0, torch.cat([a0, b0]), (("a", 0, 6), ("b", 6, 6)))
        for name in order:
            g = (a1 if name == "a" else b1).clone()
            state.sync("k/%s/6" % name, 1, g, ((name, 0, 6),))
        pushed = {key: t for key, _, t in transport.pushes}
        assert torch.equal(pushed["k/a/6"], a1 + (a0 - q(a0))), order
        assert torch.equal(pushed["k/b/6"], b1 + (b0 - q(b0))), order
        assert state._residuals.keys() == {"k/a/6", "k/b/6"}  # the split key's tensor freed
        state.close()


def test_error_feedback_keeps_no_residual_for_inf_or_nan():
    # A loss scaler's overflow step puts inf or NaN in a gradient and skips the step. The
    # residual of such an element was inf - inf = NaN and came back at every later step,
    # so the scaler skipped every step after the first overflow.
    model = nn.Linear(4, 1, bias=False)
    transport = Recording()
    sync = gtorch.GradientSync(model, transport, error_feedback=True)
    for step, bad in enumerate([None, float("inf"), float("nan"), None, None]):
        model.weight.grad = torch.full((1, 4), 0.3)
        if bad is not None:
            model.weight.grad[0, 1] = bad
        sync.sync()
        pushed = transport.pushes[-1][2]
        if bad is None:
            assert torch.isfinite(pushed).all(), (step, pushed)
            assert torch.isfinite(model.weight.grad).all(), (step, model.weight.grad)
        else:
            assert not torch.isfinite(pushed[1]), (step, pushed)
    # The finite elements still carry their quantization error forward: 0.3 is pushed as
    # 0.25, then 0.35 as 0.25, ... so the pushes average to 0.3 over the steps.
    firsts = torch.stack([p[2][0] for p in transport.pushes])
    assert abs(firsts.mean().item() - 0.3) < 0.06, firsts
    sync.close()


class FailsOnce(Recording):
    """Recording, with steps, whose push of `fail_at` (call index) raises TimeoutError."""

    def __init__(self, fail_at):
        super().__init__()
        self.fail_at, self.steps = fail_at, []

    def push_pull(self, key, step, tensor):
        self.steps.append(step)
        if len(self.steps) - 1 == self.fail_at:
            raise TimeoutError("DEADLINE_EXCEEDED: step %d: missing workers: worker-1" % step)
        super().push_pull(key, step, tensor)


@pytest.mark.parametrize("retry", [True, False])
def test_after_a_failed_push_pull_the_key_repeats_its_step(retry):
    # A failed step advances no shard: counting on past it left the worker a step ahead of
    # the shards for good ("future step" on every later push). Error feedback keeps the
    # residual it had before the failed push.
    torch.manual_seed(0)
    model = nn.Linear(4, 4, bias=False)
    transport = FailsOnce(fail_at=1)
    sync = gtorch.GradientSync(model, transport, error_feedback=True)
    x = torch.randn(2, 4)

    def backward():
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()
        return model.weight.grad.reshape(-1).clone()

    g = backward()
    sync.sync()
    residual = g - transport.quantize(g)
    assert torch.count_nonzero(residual) > 0
    g = backward()
    with pytest.raises(TimeoutError, match="missing workers"):
        sync.sync()
    if retry:
        g = backward()  # the same batch again
    sync.sync()
    sync.sync()
    assert transport.steps == [0, 1, 1, 2]
    assert torch.equal(transport.pushes[1][2], g + residual)
    sync.close()


class SlowSecondKey(comm.Transport):
    """Key .../0/... fails at once the first time; the other key takes 0.3 s a push."""

    def __init__(self):
        super().__init__()
        self.pushes, self.failed = [], False
        self.lock = threading.Lock()

    def push_pull(self, key, step, tensor):
        start = time.monotonic()
        if "/0/" in key and not self.failed:
            self.failed = True
            raise TimeoutError("DEADLINE_EXCEEDED: missing workers: worker-1")
        if "/0/" not in key:
            time.sleep(0.3)
        with self.lock:
            self.pushes.append((key, step, start, time.monotonic()))


def test_a_key_still_pushing_when_sync_fails_is_pushed_again_only_after():
    # sync() raises at the first failed bucket while another bucket's push is under way;
    # the next sync() pushes that key again only once that push is over.
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    transport = SlowSecondKey()
    sync = gtorch.GradientSync(model, transport, bucket_bytes=64)
    model(torch.ones(1, 4)).sum().backward()
    with pytest.raises(TimeoutError):
        sync.sync()
    sync.sync()
    sync.close()
    slow = [(step, start, end) for key, step, start, end in transport.pushes if "/0/" not in key]
    # The same step again: its push succeeded, but its round failed
    # (test_a_round_with_a_failed_push_is_pushed_again_whole).
    assert [step for step, _, _ in slow] == [0, 0]
    assert slow[1][1] >= slow[0][2], "the key's second push began before its first was over"
    assert [step for key, step, _, _ in transport.pushes if "/0/" in key] == [0]


class FailsKeyOnce(Recording):
    """Recording, with steps, whose first push of a key containing `fail` at `step` raises."""

    def __init__(self, fail, step=0):
        super().__init__()
        self.fail, self.fail_step, self.steps = fail, step, []

    def push_pull(self, key, step, tensor):
        self.steps.append((key, step))
        if self.fail in key and step == self.fail_step:
            self.fail = "never"
            raise TimeoutError("DEADLINE_EXCEEDED: step %d: missing workers: worker-1" % step)
        super().push_pull(key, step, tensor)


@pytest.mark.parametrize("error_feedback", [False, True])
def test_a_round_with_a_failed_push_is_pushed_again_whole(error_feedback):
    # Two buckets; the second fails once. The first one's step completed, but the caller
    # runs the batch again (or the next one) for both: had the first key moved on alone,
    # it would push that batch as its next step, averaged with the other workers' next
    # batch, and the workers' models would drift apart (a review saw it with DDP). Its
    # residual is also as before the round, so the repeated push carries the same values.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    transport = FailsKeyOnce(fail="/1/", step=1)
    sync = gtorch.GradientSync(model, transport, bucket_bytes=64,
                               error_feedback=error_feedback)
    x = torch.randn(2, 4)
    model(x).sum().backward()
    sync.sync()  # round 0
    model.zero_grad()
    model(x).sum().backward()
    with pytest.raises(TimeoutError, match="missing workers"):
        sync.sync()  # round 1: key 0 completes, key 1 fails
    pushed_first = [t for k, _, t in transport.pushes if "/0/" in k][-1]
    model.zero_grad()
    model(x).sum().backward()
    sync.sync()  # round 1 again
    sync.sync()  # round 2
    steps = {}
    for key, step in transport.steps:
        steps.setdefault(key.split("/")[1], []).append(step)
    assert steps == {"0": [0, 1, 1, 2], "1": [0, 1, 1, 2]}
    assert torch.equal([t for k, _, t in transport.pushes if "/0/" in k][2], pushed_first)
    sync.close()


class FirstFailsLastSlow(comm.Transport):
    """Key b0's first push fails at once; b1's first takes 0.5 s. With `declare_fails`,
    b1's first declaration (first_step) fails instead."""

    def __init__(self, declare_fails=False):
        super().__init__()
        self.steps, self.lock = [], threading.Lock()
        self.b0_failed, self.b1_slow = declare_fails, declare_fails
        self.declare_fails = declare_fails

    def first_step(self, key, tensor):
        if key == "b1" and self.declare_fails:
            self.declare_fails = False
            raise ConnectionError("UNAVAILABLE: DeclareTensor of b1")
        return 0

    def push_pull(self, key, step, tensor):
        with self.lock:
            self.steps.append((key, step))
        if key == "b0" and not self.b0_failed:
            self.b0_failed = True
            raise ConnectionError("UNAVAILABLE: b0 step %d" % step)
        if key == "b1" and not self.b1_slow:
            self.b1_slow = True
            time.sleep(0.5)


@pytest.mark.parametrize("declare_fails", [False, True])
def test_a_failed_round_is_taken_back_once(declare_fails):
    # b0's push fails while b1's is still under way (DDP raises at the first failed bucket),
    # and the batch is run again at once. b1's push ending later must not take b0 back a
    # second time: b0 had already pushed the step again, and would then be a step behind
    # for good. Or b1 fails before it has a step (declaring it): b0, done, is taken back.
    transport = FirstFailsLastSlow(declare_fails)
    state = gtorch.PSHookState(transport)
    futures = [state.submit(k, torch.ones(2), last=(k == "b1")) for k in ("b0", "b1")]
    with pytest.raises(ConnectionError):
        for f in futures:
            f.wait()
    for _ in range(2):
        for f in [state.submit(k, torch.ones(2), last=(k == "b1")) for k in ("b0", "b1")]:
            f.wait()
    state.close()
    steps = {}
    for key, step in transport.steps:
        steps.setdefault(key, []).append(step)
    assert steps["b0"] == [0, 0, 1], transport.steps
    assert steps["b1"] == ([0, 1] if declare_fails else [0, 0, 1]), transport.steps


def test_ddp_rounds_end_at_the_last_bucket():
    # ps_hook marks DDP's last bucket; the next push starts a round even where its key is
    # new (DDP rebuilt its buckets), so a failure there does not take earlier keys back.
    transport = FailsKeyOnce(fail="new")
    state = gtorch.PSHookState(transport)
    state.submit("ddp/bucket1/4", torch.ones(4)).wait()
    state.submit("ddp/bucket0/4", torch.ones(4), last=True).wait()
    with pytest.raises(TimeoutError):
        state.submit("ddp/new/8", torch.ones(8), last=True).wait()
    state.submit("ddp/bucket0/4", torch.ones(4)).wait()
    assert transport.steps[-1] == ("ddp/bucket0/4", 1)
    state.close()


def test_zero_element_parameters_push_nothing():
    model = nn.ParameterDict({"empty": nn.Parameter(torch.zeros(0)),
                              "brain": nn.Parameter(torch.zeros(0, dtype=torch.bfloat16)),
                              "w": nn.Parameter(torch.ones(3))})
    transport = Recording()
    sync = gtorch.GradientSync(model, transport)
    for p in model.values():
        p.grad = torch.ones_like(p)
    sync.sync()
    keys = [k for k, _, _ in transport.pushes]
    assert len(keys) == 1 and keys[0].endswith("/3"), keys
    # Every parameter frozen, unused ones allowed: nothing to push, no error.
    for p in model.values():
        p.requires_grad_(False)
    unused = gtorch.GradientSync(model, transport, prefix="u", find_unused_parameters=True)
    unused.sync()
    assert len(transport.pushes) == 1
    for s in (sync, unused):
        s.close()


def test_options_are_checked_when_made_naming_the_option():
    transport = TwoWorkers()
    cases = [
        (lambda: gtorch.PSHookState(transport, error_feedback="no"), TypeError,
         r"PSHookState: error_feedback must be bool, got 'no'"),
        (lambda: gtorch.PSHookState(transport, max_inflight=0), ValueError,
         r"max_inflight must be at least 1, got 0"),
        (lambda: gtorch.PSHookState(transport, prefix=None), TypeError,
         r"prefix must be str, got None"),
        (lambda: gtorch.PSHookState(transport, prefix=""), ValueError, r"non-empty"),
        (lambda: gtorch.PSHookState(transport, start_step="3"), TypeError,
         r"PSHookState: start_step must be int, got '3'"),
        (lambda: gtorch.GradientSync(nn.Linear(2, 2), transport, prefix=""), ValueError,
         r"^GradientSync: prefix must be a non-empty string"),
        (lambda: gtorch.GradientSync(nn.Linear(2, 2), transport, start_step=-1), ValueError,
         r"^GradientSync: start_step must be at least 0, got -1"),
        (lambda: gtorch.GradientSync(list(nn.Linear(2, 2).parameters()), transport),
         TypeError, r"GradientSync: model must be a torch.nn.Module .*got list"),
        (lambda: gtorch.GradientSync(nn.Linear(2, 2), transport, bucket_bytes="1M"),
         TypeError, r"GradientSync: bucket_bytes must be int, got '1M'"),
        (lambda: gtorch.GradientSync(nn.Linear(2, 2), transport, bucket_bytes=0),
         ValueError, r"bucket_bytes must be at least 1"),
        (lambda: gtorch.GradientSync(nn.Linear(2, 2), transport, find_unused_parameters="no"),
         TypeError, r"find_unused_parameters must be bool"),
        (lambda: comm.ClientTransport(object(), policy="near-lossless"), TypeError,
         r"ClientTransport: policy must be a gcomp.codec.Policy"),
        (lambda: comm.GlooTransport(chunk_bytes="1M"), ValueError,
         r"chunk_bytes must be an int of at least 4"),
        (lambda: comm.GlooTransport(mode="none", policy=codec.Policy()), ValueError,
         r"mode 'none' and policy .* disagree"),
    ]
    for make, error, message in cases:
        with pytest.raises(error, match=message):
            make()
