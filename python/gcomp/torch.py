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
import threading

import torch

from gcomp import codec


class PSHookState:
    """State of `ps_hook`: the transport, per-key step counters and residuals.

    Push-pulls run on background threads (the extension releases the GIL while they wait
    on the network), so backward keeps computing the next buckets meanwhile. A transport
    whose calls are collectives (`ordered = True`, GlooTransport) gets one thread, so every
    worker issues them in the order DDP hands buckets over; the parameter server's Client
    takes several buckets at once.
    """

    def __init__(self, transport, error_feedback=False, max_inflight=4):
        self.transport = transport
        self.error_feedback = error_feedback
        self._steps = {}
        self._residuals = {}
        self._lock = threading.Lock()
        threads = 1 if getattr(transport, "ordered", False) else max(1, max_inflight)
        self._executor = concurrent.futures.ThreadPoolExecutor(threads,
                                                               thread_name_prefix="gcomp-ps")

    def next_step(self, key):
        with self._lock:
            step = self._steps.get(key, 0)
            self._steps[key] = step + 1
            return step

    def sync(self, key, step, flat):
        """Push-pull of one flat tensor in place (error feedback applied)."""
        if self.error_feedback:
            residual = self._residuals.get(key)
            if residual is not None:
                flat.add_(residual)
            pushed = self.transport.quantize(flat)
            if pushed is not flat:
                # Kept in float32 (a bfloat16 difference would round most of it away), on
                # the gradient's device (the codec's round trip runs on the CPU).
                self._residuals[key] = flat.float() - pushed.to(flat.device).float()
        self.transport.push_pull(key, step, flat)

    def submit(self, key, flat):
        """Schedules sync() on the background thread; returns a torch Future of `flat`."""
        step = self.next_step(key)
        fut = torch.futures.Future()

        def run():
            try:
                self.sync(key, step, flat)
                fut.set_result(flat)
            except BaseException as e:  # surfaces in DDP's wait, naming the cause
                fut.set_exception(e)

        self._executor.submit(run)
        return fut

    def close(self):
        self._executor.shutdown(wait=True)


def ps_hook(state, bucket):
    """DDP communication hook: push-pull of the bucket to the shards; returns the mean.

    The key is the bucket's index and size: DDP may rebuild its buckets after the first
    iteration, and a rebuilt bucket is a new tensor for the shards.
    """
    buf = bucket.buffer()
    check_tensor(buf, "ps_hook", state.transport)
    key = "ddp/bucket%d/%d" % (bucket.index(), buf.numel())
    # torch 1.13's Future.set_exception stores the exception as the future's value, which
    # DDP's C++ side then fails to read as a Tensor ("Unable to cast ... to Tensor"). A
    # callback that raises marks the chained future failed in C++ itself, so DDP's backward
    # raises naming the original exception's type and message.
    return state.submit(key, buf).then(_value_or_raise)


def _value_or_raise(fut):
    return fut.wait()


def check_tensor(t, who, transport):
    """TypeError naming what is wrong with a gradient `transport` cannot take."""
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
    `bucket_bytes`, each bucket one key. Call sync() after backward()."""

    def __init__(self, model, transport, error_feedback=False, bucket_bytes=25 << 20,
                 prefix="grads"):
        self.state = PSHookState(transport, error_feedback)
        self.params = [p for p in model.parameters() if p.requires_grad]
        for p in self.params:
            check_tensor(p, "GradientSync", transport)
        # A bucket holds parameters of one dtype (each key is declared with its dtype);
        # buckets of a dtype follow the order of the model's parameters.
        self.buckets = []
        open_buckets = {}  # dtype -> [params, bytes]
        for p in self.params:
            current = open_buckets.setdefault(p.dtype, [[], 0])
            current[0].append(p)
            current[1] += p.numel() * p.element_size()
            if current[1] >= bucket_bytes:
                self.buckets.append(current[0])
                del open_buckets[p.dtype]
        self.buckets.extend(params for params, _ in open_buckets.values())
        self.prefix = prefix

    def sync(self):
        futures = []
        for i, params in enumerate(self.buckets):
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            key = "%s/%d/%d" % (self.prefix, i, flat.numel())
            futures.append((params, flat, self.state.submit(key, flat)))
        for params, flat, fut in futures:
            fut.wait()
            offset = 0
            for p in params:
                n = p.numel()
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                p.grad.copy_(flat[offset:offset + n].view_as(p))
                offset += n

    def close(self):
        self.state.close()
