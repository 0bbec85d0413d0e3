"""PyTorch integration: a DDP communication hook and a wrapper for plain training loops.

DDP:
    state = gcomp.torch.PSHookState(transport)
    model.register_comm_hook(state, gcomp.torch.ps_hook)

Without DDP (after loss.backward(), before optimizer.step()):
    sync = gcomp.torch.GradientSync(model, transport)
    sync.sync()

Both replace all-reduce with push-pull of each gradient bucket to the shards; the result is
the mean gradient over workers. Gradients may be float32, bfloat16 or float16 tensors, each
key declared with its dtype and compressed in it; on the CPU, or on a CUDA device with
ClientTransport, whose worker Client then encodes and decodes them with the GPU codec. With error_feedback=True the quantization residual of what
was pushed stays on the worker and is added to the next step's gradient.
"""
import concurrent.futures
import contextlib
import threading
import weakref

import torch

from gcomp import codec


class _Round:
    """The pushes of one round (see PSHookState.begin_round)."""

    def __init__(self):
        self.keys = set()  # submitted
        self.done = {}     # key -> step (None: failed before it had one), once its push ended
        self.rewound = set()  # keys of a failed round taken back already
        self.undo = {}     # key -> the residuals its push replaced (error feedback)
        self.failed = False
        self.ended = False  # the round's last push was submitted (DDP's last bucket)


class PSHookState:
    """State of `ps_hook`: the transport, per-key step counters and residuals.

    Push-pulls run on background threads (the extension releases the GIL while they wait
    on the network), so backward keeps computing the next buckets meanwhile. A transport
    whose calls are collectives (`ordered = True`, GlooTransport) gets one thread, so every
    worker issues them in the order DDP hands buckets over; the parameter server's Client
    takes several buckets at once.
    """

    def __init__(self, transport, error_feedback=False, max_inflight=4, prefix="ddp",
                 start_step=None, _caller="PSHookState"):
        """`prefix` starts every key this state pushes ("<prefix>/bucket<i>/<elements>"
        under ps_hook). Each model synced through one transport needs its own: two models
        whose buckets have the same size would otherwise share keys on the shards.

        `start_step`: the steps the model state this process starts from has completed
        (a worker that restored its own saved state). None: each key starts where the
        shards are. Given, each key's first push is that step; the shards answer it with
        the result they hold when they completed it already (the dead process pushed it),
        and a key whose shards are another step away is refused with a ValueError naming
        both steps, instead of training one step out of line with the other workers."""
        _check_transport(transport, _caller)
        _check_option(_caller, "error_feedback", error_feedback, bool)
        _check_option(_caller, "max_inflight", max_inflight, int, minimum=1)
        _check_option(_caller, "prefix", prefix, str)
        if not prefix:
            raise ValueError("%s: prefix must be a non-empty string" % _caller)
        if start_step is not None:
            _check_option(_caller, "start_step", start_step, int, minimum=0)
        self.start_step = start_step
        self.transport = transport
        self.error_feedback = error_feedback
        self.prefix = prefix
        self._steps = {}
        self._inflight = {}  # key -> concurrent.futures.Future of its latest push
        self._residuals = {}  # key -> (layout, float32 residual) of its last push
        # Parameter (data_ptr) -> (key, its float32 residual): from the last push holding it.
        self._param_residuals = {}
        self._lock = threading.Lock()
        self._round = _Round()
        self._closed = False
        self._close_lock = threading.Lock()
        threads = 1 if getattr(transport, "ordered", False) else max(1, max_inflight)
        self._executor = concurrent.futures.ThreadPoolExecutor(threads,
                                                               thread_name_prefix="gcomp-ps")

    def next_step(self, key, flat=None):
        """The step of this push of `key`: counted from the transport's first_step (where the
        shards are, for a worker or job that restarts on running shards)."""
        with self._lock:
            step = self._steps.get(key)
        if step is None:
            first = getattr(self.transport, "first_step", None)
            shards = int(first(key, flat)) if callable(first) and flat is not None else None
            step = self.start_step if self.start_step is not None else (shards or 0)
            # The shards hold the result of their last completed step (shards - 1) only.
            if shards is not None and not shards - 1 <= step <= shards:
                raise ValueError(
                    "key %r: this process starts at step %d (start_step) but the shards "
                    "expect step %d (they completed step %d); restore the model state of "
                    "step %d or %d, or restart the whole job from a checkpoint"
                    % (key, step, shards, shards - 1, shards - 1, shards))
        with self._lock:
            step = self._steps.get(key, step)
            self._steps[key] = step + 1
            return step

    def begin_round(self):
        """Starts a round of pushes: one DDP backward or one GradientSync.sync(), each key
        pushed at most once. ps_hook and GradientSync call it; a push of a key already
        pushed in the round under way starts a new one too."""
        with self._lock:
            self._round = _Round()

    def _finish(self, round_, key, step, ok):
        """A push of `key` at `step` in `round_` ended. A round with a failed push is pushed
        again whole: every key of it repeats its step next time, and its error-feedback
        residual is as before the round. A failed step advanced no shard (or, where the
        shards completed it and the answer was lost, they answer its result again), so
        counting on past it would put this worker a step ahead of the shards for good. And
        a key whose step did complete must repeat it too (answered with the result the
        shards hold): the caller runs the batch again, or goes on with the next one, for
        all keys of the round, and a key that moved on alone would push that batch as its
        next step, averaged with the other workers' next batch (DDP with several buckets
        of which one failed)."""
        with self._lock:
            round_.done[key] = step
            round_.failed = round_.failed or not ok
            if not round_.failed:
                return
            # Each key once: at the first failure, the keys whose push is over; later, each
            # one as its own push ends. A key rewound already may have been pushed again by
            # the next round meanwhile (the caller runs the batch again as soon as it sees
            # the error), and rewinding it again would put it a step behind the others.
            for k, s in round_.done.items():
                if k in round_.rewound:
                    continue
                round_.rewound.add(k)
                if s is not None and self._steps.get(k) == s + 1:
                    self._steps[k] = s
                undo = round_.undo.pop(k, None)
                if undo is not None:
                    self._restore_residuals(k, undo)

    def sync(self, key, step, flat, layout=None, _round=None):
        """Push-pull of one flat tensor in place (error feedback applied). `layout`, where
        known, lists the (parameter, offset, elements) pieces of `flat`: a key whose
        pieces changed since the last push (a DDP bucket rebuilt, a layer frozen) gets each
        parameter's own residual back, not whatever sat at the same offsets."""
        residual = None
        if self.error_feedback:
            kept = self._residual_for(key, flat, layout)
            if kept is not None:
                flat.add_(kept)
            pushed = self.transport.quantize(flat)
            if pushed is not flat:
                # Kept in float32 (a bfloat16 difference would round most of it away), on
                # the gradient's device (the codec's round trip runs on the CPU). Inf and
                # NaN go through exactly and leave no residual: inf - inf is NaN, which
                # would be added to that element at every later step (an overflow that a
                # loss scaler skips would then make it skip every step after).
                # In place: torch 1.13's out-of-place nan_to_num took 15x the in-place one
                # on the CPU (a 16 MB tensor), half of the residual's time on a 67 MB bucket.
                residual = flat.float() - pushed.to(flat.device).float()
                torch.nan_to_num_(residual, nan=0.0, posinf=0.0, neginf=0.0)
        self.transport.push_pull(key, step, flat)
        if residual is None:
            return
        # Only a push-pull that succeeded replaces the residuals: after a failed one the
        # step is pushed again (or the next batch is) with the residuals it had.
        with self._lock:
            before = self._residuals.get(key)
            if _round is not None and key not in _round.undo:
                _round.undo[key] = (before, {p: self._param_residuals.get(p)
                                             for p, _, _ in layout or ()})
            self._residuals[key] = (layout, residual)
            if layout is None:
                return
            # Each parameter's residual is kept by parameter, so that wherever it sits next
            # it gets its own back. Replaced only by a push holding that parameter: when a
            # bucket splits in two, each half finds its part whichever half finishes first.
            for p, offset, n in layout:
                self._param_residuals[p] = (key, residual[offset:offset + n])
            if before is None or before[0] != layout:
                # Buckets were rebuilt: drop keys none of whose parameters read from them.
                read = {k for k, _ in self._param_residuals.values()}
                for other in [k for k, (old, _) in self._residuals.items()
                              if old is not None and k not in read]:
                    del self._residuals[other]

    def _restore_residuals(self, key, undo):
        """Puts back the residuals a push of `key` replaced (`undo`, recorded by sync)."""
        before, params = undo
        if before is None:
            self._residuals.pop(key, None)
        else:
            self._residuals[key] = before
        for p, got in params.items():
            if got is None:
                self._param_residuals.pop(p, None)
            else:
                self._param_residuals[p] = got

    def _residual_for(self, key, flat, layout):
        with self._lock:
            kept = self._residuals.get(key)
            if layout is None:
                if kept is None or kept[1].numel() != flat.numel():
                    return None
                return kept[1]
            # The key's own residual where it pushed the same pieces last and still holds
            # each one's latest residual (the common case: one tensor, no copy).
            if kept is not None and kept[0] == layout and all(
                    self._param_residuals.get(p, (None,))[0] == key for p, _, _ in layout):
                return kept[1]
            pieces = [(offset, n, self._param_residuals.get(p)) for p, offset, n in layout]
        if all(got is None for _, _, got in pieces):
            return None
        # Gathered, each parameter's from the push that last held it.
        out = torch.zeros(flat.numel(), dtype=torch.float32, device=flat.device)
        for offset, n, got in pieces:
            if got is not None and got[1].numel() == n:
                out[offset:offset + n] = got[1]
        return out

    def submit(self, key, flat, layout=None, last=False):
        """Schedules sync() on the background thread; returns a torch Future of `flat`.
        An empty `flat` (zero-element parameters only) has nothing to push: its future is
        done at once."""
        if flat.numel() == 0:
            fut = torch.futures.Future()
            fut.set_result(flat)
            return fut
        # Checked and claimed under one lock with close(): a closed state must not take its
        # keys back.
        with self._close_lock:
            if self._closed:
                raise RuntimeError(
                    "this PSHookState or GradientSync (prefix %r) is closed; make a new one "
                    "to push again" % (self.prefix,))
            _claim_key(self.transport, key, self)
        fut = torch.futures.Future()
        with self._lock:
            previous = self._inflight.get(key)
            if self._round.ended or key in self._round.keys:
                self._round = _Round()
            round_ = self._round
            round_.keys.add(key)
            round_.ended = last

        def run():
            try:
                # One push of a key at a time: after a failed step, DDP or sync() stops
                # waiting at the first error, and the next iteration's push of a key may
                # come while that key's push of the failed one is still under way. Its step
                # is taken once that one is over (and has rewound the count if it failed).
                if previous is not None:
                    concurrent.futures.wait([previous])
                step = None  # None: it failed before it had a step (declaring the key)
                try:
                    step = self.next_step(key, flat)
                    self.sync(key, step, flat, layout, round_)
                except BaseException:
                    self._finish(round_, key, step, ok=False)
                    raise
                self._finish(round_, key, step, ok=True)
                fut.set_result(flat)
            except BaseException as e:  # surfaces in DDP's wait, naming the cause
                fut.set_exception(e)

        done = self._executor.submit(run)
        with self._lock:
            self._inflight[key] = done
        return fut

    def close(self):
        """Waits for the push-pulls under way and gives up this state's keys (a new state may
        then push them, from the shards' step). Closing twice is harmless."""
        with self._close_lock:
            self._closed = True
        self._executor.shutdown(wait=True)
        _release_keys(self.transport, self)


def _is_worker_client(x):
    """A worker Client (the extension's, or gcomp.cluster's wrapper of it)."""
    from gcomp import cluster
    import gcomp
    if isinstance(x, cluster.WorkerClient):
        return True
    client_class = getattr(gcomp.extension(), "Client", None) if gcomp.have_extension() else None
    return client_class is not None and isinstance(x, client_class)


def _check_transport(transport, who):
    """Refuses what cannot carry the mean gradient: a worker Client not wrapped in a
    transport, or shards configured to answer with updated parameters instead."""
    if not callable(getattr(transport, "push_pull", None)) or _is_worker_client(transport):
        raise TypeError(
            "%s takes a transport, got %s: wrap a worker Client as "
            "gcomp.comm.ClientTransport(client) (e.g. %s(%sClientTransport("
            "gcomp.cluster.connect(config_path, rank))))"
            % (who, type(transport).__name__, who, "model, " if who == "GradientSync" else ""))
    config = getattr(getattr(transport, "client", None), "config", None)
    optimizer = (config or {}).get("optimizer", {}).get("name", "none")
    if optimizer != "none":
        raise ValueError(
            "%s: the cluster config sets optimizer %r, so the shards answer each push with "
            "updated parameters, not the mean gradient this hands to your optimizer (training "
            "would silently go wrong); set optimizer: none in the config (LocalCluster's "
            "default) and keep the optimizer in the training script" % (who, optimizer))


# Which PSHookState pushes each key, per key space (Transport.key_space): a second state
# pushing the same key (a second model of the same shape) would get the first one's
# results from the shards.
_owners_lock = threading.Lock()
_owners = {}  # key space -> {key: weakref to its PSHookState}


def _key_space(transport):
    space = getattr(transport, "key_space", None)
    return space() if callable(space) else ("transport", id(transport))


def _claim_key(transport, key, state):
    with _owners_lock:
        keys = _owners.setdefault(_key_space(transport), {})
        ref = keys.get(key)
        holder = ref() if ref is not None else None
        if holder is None:
            keys[key] = weakref.ref(state)
        elif holder is not state:
            raise ValueError(
                "key %r is already pushed by another PSHookState or GradientSync of this "
                "worker that is not closed. If it is an earlier one of the same model, "
                "close() it first; if it is another model, give each model its own prefix "
                "(two models whose buckets have the same size would share keys on the "
                "shards and get each other's gradients), e.g. PSHookState(transport, "
                "prefix=%r) or GradientSync(model, transport, prefix=%r)"
                % (key, state.prefix + "2", state.prefix + "2"))


def _release_keys(transport, state):
    with _owners_lock:
        space = _key_space(transport)
        keys = _owners.get(space, {})
        for key, ref in list(keys.items()):
            if ref() is None or ref() is state:
                del keys[key]
        if not keys:
            _owners.pop(space, None)


def ps_hook(state, bucket):
    """DDP communication hook: push-pull of the bucket to the shards; returns the mean.

    The key is the bucket's index and size, and its dtype where that is not float32
    ("<prefix>/bucket<i>/<elements>[/bf16|/f16]"): DDP may rebuild its buckets after the
    first iteration, and a rebuilt bucket is a new tensor for the shards.
    """
    # An error raised here, rather than carried by the returned future, leaves DDP's reducer
    # half way through the step, and the next backward fails on a PyTorch internal assert.
    try:
        if not isinstance(state, PSHookState):
            raise TypeError(
                "ps_hook's state must be a gcomp.torch.PSHookState, got %s: "
                "model.register_comm_hook(PSHookState(ClientTransport(client)), ps_hook)"
                % type(state).__name__)
        buf = bucket.buffer()
        check_tensor(buf, "ps_hook", state.transport)
        key = _bucket_key("%s/bucket%d" % (state.prefix, bucket.index()), buf)
        layout = None
        if state.error_feedback:
            base, esize = buf.data_ptr(), buf.element_size()
            layout = tuple((p.data_ptr(), (g.data_ptr() - base) // esize, g.numel())
                           for p, g in zip(bucket.parameters(), bucket.gradients()))
        # DDP hands buckets over in index order; the last ends the backward's round.
        fut = state.submit(key, buf, layout, last=bucket.is_last())
    except Exception as e:  # pylint: disable=broad-except
        fut = torch.futures.Future()
        fut.set_exception(e)
    # torch 1.13's Future.set_exception stores the exception as the future's value, which
    # DDP's C++ side then fails to read as a Tensor ("Unable to cast ... to Tensor"). A
    # callback that raises marks the chained future failed in C++ itself, so DDP's backward
    # raises naming the original exception's type and message.
    return fut.then(_value_or_raise)


def _bucket_key(name, flat):
    """`name`/<elements>, and /bf16 or /f16 for those dtypes: one key never changes dtype
    when the buckets are rebuilt or a layer of another dtype is frozen."""
    suffix = {torch.bfloat16: "/bf16", torch.float16: "/f16"}.get(flat.dtype, "")
    return "%s/%d%s" % (name, flat.numel(), suffix)


def _check_option(who, name, value, kind, minimum=None):
    """TypeError or ValueError naming option `name` of `who` (bool is no int here)."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError("%s: %s must be %s, got %r" % (who, name, kind.__name__, value))
    if minimum is not None and value < minimum:
        raise ValueError("%s: %s must be at least %d, got %r" % (who, name, minimum, value))


def _value_or_raise(fut):
    return fut.wait()


def check_tensor(t, who, transport):
    """TypeError naming what is wrong with a gradient `transport` cannot take."""
    if t.layout != torch.strided:
        raise TypeError("%s: %s gradients are not supported (dense tensors only: e.g. "
                        "nn.Embedding(..., sparse=False))" % (who, t.layout))
    if t.device.type == "cuda":
        why = transport.cuda_unsupported()
        if why:
            raise TypeError("%s: %s" % (who, why))
    elif t.device.type != "cpu":
        raise TypeError("%s: %s gradients are not supported (CPU or CUDA tensors only)"
                        % (who, t.device.type))
    if t.dtype not in codec.TORCH_DTYPES:
        raise TypeError("%s: %s gradients are not supported (float32, bfloat16 or float16)"
                        % (who, t.dtype))


class GradientSync:
    """For training loops without DDP: push-pull of all gradients, in buckets of about
    `bucket_bytes`, each bucket one key ("<prefix>/<i>/<elements>", and /bf16 or /f16 for
    those dtypes). Call sync() after
    backward().

    The parameters synced are those with requires_grad at each sync(): freezing or
    unfreezing a layer changes the buckets on every worker alike (every worker must do it
    at the same step). As with DDP, every synced parameter needs a gradient on every worker
    unless `find_unused_parameters=True`: then each sync() also push-pulls one flag per
    parameter, a parameter that no worker gave a gradient keeps `grad` None, and one that
    only some workers did gets the mean, counting the others as zeros."""

    def __init__(self, model, transport, error_feedback=False, bucket_bytes=25 << 20,
                 prefix="grads", find_unused_parameters=False, start_step=None):
        """`start_step` as for PSHookState: the steps a restored model state has completed."""
        if not callable(getattr(model, "parameters", None)):
            raise TypeError("GradientSync: model must be a torch.nn.Module (something with "
                            "parameters()), got %s" % type(model).__name__)
        _check_option("GradientSync", "bucket_bytes", bucket_bytes, int, minimum=1)
        _check_option("GradientSync", "find_unused_parameters", find_unused_parameters, bool)
        self.state = PSHookState(transport, error_feedback, prefix=prefix,
                                 start_step=start_step, _caller="GradientSync")
        self.model = model
        self.bucket_bytes = bucket_bytes
        self.prefix = prefix
        self.find_unused_parameters = find_unused_parameters
        self._names = {id(p): name for name, p in _named_parameters(model)}
        self.params = []
        self.buckets = []
        self._rebuild()

    def _rebuild(self):
        params = [p for p in self.model.parameters() if p.requires_grad]
        if [id(p) for p in params] == [id(p) for p in self.params] and self.buckets:
            return
        for p in params:
            check_tensor(p, "GradientSync", self.state.transport)
        # A bucket holds parameters of one dtype (each key is declared with its dtype);
        # buckets of a dtype follow the order of the model's parameters.
        buckets = []
        open_buckets = {}  # dtype -> [params, bytes]
        for p in params:
            current = open_buckets.setdefault(p.dtype, [[], 0])
            current[0].append(p)
            current[1] += p.numel() * p.element_size()
            if current[1] >= self.bucket_bytes:
                buckets.append(current[0])
                del open_buckets[p.dtype]
        buckets.extend(ps for ps, _ in open_buckets.values())
        self.params, self.buckets = params, buckets

    def _name(self, p):
        return self._names.get(id(p), "of shape %s" % (tuple(p.shape),))

    def sync(self):
        self._rebuild()
        missing = [p for p in self.params if p.grad is None]
        if missing and not self.find_unused_parameters:
            raise ValueError(
                "GradientSync.sync(): %d of the %d parameters that require grad have no "
                "gradient on this worker (the first: %s); call sync() after "
                "loss.backward(), or pass find_unused_parameters=True when some parameters "
                "get no gradient in some steps" % (len(missing), len(self.params),
                                                   self._name(missing[0])))
        for p in self.params:
            if p.grad is not None:
                check_tensor(p.grad, "GradientSync", self.state.transport)
        self.state.begin_round()
        futures = []
        for i, params in enumerate(self.buckets):
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            key = _bucket_key("%s/%d" % (self.prefix, i), flat)
            layout, offset = [], 0
            for p in params:
                layout.append((p.data_ptr(), offset, p.numel()))
                offset += p.numel()
            futures.append((params, flat, self.state.submit(key, flat, tuple(layout))))
        used = None
        if self.find_unused_parameters and self.params:
            # 1 where this worker has a gradient; the mean is > 0 where any worker has one
            # (>= 1/W, far above the codec's floor, and zeros stay zero).
            flags = torch.tensor([0.0 if p.grad is None else 1.0 for p in self.params])
            key = "%s/used/%d" % (self.prefix, flags.numel())
            mean = self.state.submit(key, flags).wait()
            used = {id(p): bool(u > 0) for p, u in zip(self.params, mean)}
        for params, flat, fut in futures:
            fut.wait()
            offset = 0
            for p in params:
                n = p.numel()
                if p.grad is None:
                    if used is not None and not used[id(p)]:
                        offset += n
                        continue  # no worker had a gradient: left as DDP leaves it
                    p.grad = torch.zeros_like(p)
                p.grad.copy_(flat[offset:offset + n].view_as(p))
                offset += n

    def close(self):
        self.state.close()


def _named_parameters(model):
    named = getattr(model, "named_parameters", None)
    return list(named()) if callable(named) else []


@contextlib.contextmanager
def broadcast_in_float32():
    """DDP's start-up broadcast of rank 0's parameters and buffers, with bfloat16 and
    float16 tensors moved as float32 (other dtypes as they are), while this is active:

        with gcomp.torch.broadcast_in_float32():
            ddp = torch.nn.parallel.DistributedDataParallel(model)

    DDP broadcasts once, when it wraps the model, and gloo in torch 1.13 cannot move
    bfloat16 ("RuntimeError: Invalid scalar type"); the hook itself never needs gloo for
    gradients. bfloat16 and float16 widen to float32 exactly, so every rank ends with rank
    0's values as they were. It replaces torch's private
    `torch.nn.parallel.distributed._sync_module_states` for the duration, and says so if this
    torch has no such function."""
    import torch.distributed as dist
    import torch.nn.parallel.distributed as ddp_module
    original = getattr(ddp_module, "_sync_module_states", None)
    if original is None:
        raise RuntimeError(
            "broadcast_in_float32: this torch (%s) has no "
            "torch.nn.parallel.distributed._sync_module_states to replace; wrap the model "
            "in float32 and convert it after DDP is made" % torch.__version__)

    def sync(module, process_group, broadcast_bucket_size, src, params_and_buffers_to_ignore,
             *unused_args, broadcast_buffers=True, **unused_kwargs):
        ignore = set(params_and_buffers_to_ignore or ())
        named = list(module.named_parameters())
        if broadcast_buffers:
            named += list(module.named_buffers())
        # DDP names `src` within its process group; broadcast takes a global rank.
        if process_group is not None:
            global_rank = getattr(dist, "get_global_rank", None) or \
                dist.distributed_c10d._get_global_rank
            src = global_rank(process_group, src)  # the identity for the default group
        for name, t in named:
            if name in ignore:
                continue
            if t.dtype in (torch.bfloat16, torch.float16):
                wide = t.detach().float()  # exact; gloo moves float32
                dist.broadcast(wide, src, group=process_group)
                t.detach().copy_(wide)
            else:
                # Other dtypes as they are (float64 and integers would lose bits in float32).
                whole = t.detach().contiguous()
                dist.broadcast(whole, src, group=process_group)
                if whole.data_ptr() != t.data_ptr():
                    t.detach().copy_(whole)

    ddp_module._sync_module_states = sync
    try:
        yield
    finally:
        ddp_module._sync_module_states = original
