"""Transports: how one worker's gradient becomes the mean over all workers.

A transport does push-pull of one flat tensor for one (key, step) in place and counts the
bytes it moved. Two exist:

* `ClientTransport`: the parameter server. The C++ worker Client chunks, encodes and pushes
  to the shards, which sum, average and send the (encoded) mean back.
* `GlooTransport`: the same arithmetic over a torch.distributed process group, for machines
  without shards and for development: every worker's contribution (cut into chunks of
  `chunk_bytes` and encoded a block per chunk, as a worker's Client does) is gathered,
  decoded, summed in worker order, averaged, and the mean goes through the codec once more
  as the shards' replies would. Byte counts are those of a PS: the blocks' bytes.

Byte accounting, per worker and both directions: `raw_bytes` is what uncompressed floats
would take (push + pull), `wire_bytes` is what was sent (codec frames, or raw floats in
mode "none").
"""
import torch
import torch.distributed as dist

from gcomp import codec

MODES = ("none", "lossless", "near-lossless")


def policy_for(mode, rel_bits=7, abs_log2=-16):
    """The codec policy of a training mode; None for "none". "near_lossless" is read as
    "near-lossless", as the cluster config's parser reads it."""
    if mode == "near_lossless":
        mode = "near-lossless"
    if mode not in MODES:
        raise ValueError("mode must be one of %s, got %r" % (MODES, mode))
    if mode == "none":
        return None
    return codec.Policy(mode=mode, rel_bits=rel_bits, abs_log2=abs_log2)


class Transport:
    # Whether calls must be issued in the same order on every worker (collectives).
    ordered = False

    def cuda_unsupported(self):
        """None if push_pull takes CUDA tensors, else why not (one line naming the fix)."""
        return ("%s moves CPU tensors only; use ClientTransport (the parameter server) for "
                "CUDA gradients" % type(self).__name__)

    def __init__(self):
        self.raw_bytes = 0
        self.wire_bytes = 0

    def push_pull(self, key, step, tensor):
        """Replaces `tensor` (flat, contiguous, CPU; float32, bfloat16 or float16) with the
        mean over workers."""
        raise NotImplementedError

    def quantize(self, tensor):
        """What the shards receive when this worker pushes `tensor` (for error feedback)."""
        return tensor

    def first_step(self, key, tensor):
        """The step a key's first push_pull in this process uses: 0 unless the transport
        keeps state between runs."""
        return 0

    def key_space(self):
        """Transports with equal key spaces push the same key to the same place: a key may
        have one pusher (gcomp.torch refuses a second) in each."""
        return ("transport", id(self))

    def close(self):
        pass


def _check_policy(who, policy):
    if policy is not None and not isinstance(policy, codec.Policy):
        raise TypeError("%s: policy must be a gcomp.codec.Policy (e.g. "
                        "gcomp.comm.policy_for(\"near-lossless\")), got %r" % (who, policy))


class GlooTransport(Transport):
    """PS arithmetic over a gloo process group (see the module comment).

    `chunk_bytes` must be the cluster config's `chunk_bytes` (default 1 MiB) for results
    and byte counts to match the parameter server's exactly."""

    ordered = True  # collectives: every rank must call in the same order

    def __init__(self, mode=None, policy=None, group=None,
                 chunk_bytes=codec.DEFAULT_BLOCK_BYTES, block_bytes=None):
        super().__init__()
        if block_bytes is not None:  # the argument's earlier name
            chunk_bytes = block_bytes
        _check_policy("GlooTransport", policy)
        if policy is not None and mode is not None and \
                getattr(policy_for(mode), "mode", "none") != policy.mode:
            raise ValueError("GlooTransport: mode %r and policy %r disagree; give one of them"
                             % (mode, policy))
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 4:
            raise ValueError("GlooTransport: chunk_bytes must be an int of at least 4 (the "
                             "cluster config's chunk_bytes), got %r" % (chunk_bytes,))
        self.policy = policy if policy is not None else policy_for(mode or "none")
        # A group of its own by default (made here, so every rank must construct its
        # transport at the same point): DDP runs collectives of its own on the default
        # group during backward (with find_unused_parameters, an all-reduce of which
        # parameters were used) while this transport's run on the hook's thread. Sharing
        # one group, the two orders could differ between ranks and every rank would wait
        # forever.
        self.group = group if group is not None else dist.new_group(backend="gloo")
        if int(chunk_bytes) < 1:
            raise ValueError("chunk_bytes must be at least 1, got %r" % (chunk_bytes,))
        self.chunk_bytes = int(chunk_bytes)
        self.world = dist.get_world_size(group)

    def _gather_bytes(self, frame):
        n = torch.tensor([len(frame)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(sizes, n, group=self.group)
        longest = int(max(s.item() for s in sizes))
        mine = torch.zeros(longest, dtype=torch.uint8)
        mine[: len(frame)] = torch.frombuffer(bytearray(frame), dtype=torch.uint8)
        frames = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world)]
        dist.all_gather(frames, mine, group=self.group)
        return [f[: int(s.item())].numpy().tobytes() for f, s in zip(frames, sizes)]

    def _encode(self, tensor):
        """One frame of one block per chunk, and the blocks' bytes (a PS sends no frame
        header: each chunk travels as its block)."""
        frames = [codec.encode(c, self.policy, self.chunk_bytes)
                  for c in _chunks(tensor, self.chunk_bytes)]
        return frames, sum(len(f) - _frame_header_bytes(f) for f in frames)

    def push_pull(self, key, step, tensor):
        raw = tensor.numel() * tensor.element_size()
        self.raw_bytes += 2 * raw
        if self.policy is None:
            # Gloo (torch 1.13) moves neither bfloat16 nor int16: the bits travel as bytes.
            wire = tensor.view(torch.uint8) if tensor.dtype == torch.bfloat16 else tensor
            parts = [torch.empty_like(wire) for _ in range(self.world)]
            dist.all_gather(parts, wire, group=self.group)
            parts = [p.view(tensor.dtype) for p in parts]
            self.wire_bytes += 2 * raw
        else:
            frames, sent = self._encode(tensor)
            parts = []
            for joined in self._gather_bytes(_join(frames)):
                part = torch.empty_like(tensor)
                for f, c in zip(_split(joined), _chunks(part, self.chunk_bytes)):
                    codec.decode(f, c)
                parts.append(part)
            self.wire_bytes += sent
        # Summed in float32 in worker order and rounded once to the tensor's dtype, as the
        # shards do.
        total = parts[0].float()
        for p in parts[1:]:
            total += p.float()
        total /= self.world
        total = total.to(tensor.dtype)
        if self.policy is None:
            tensor.copy_(total)
        else:
            replies, received = self._encode(total)
            self.wire_bytes += received
            for f, c in zip(replies, _chunks(tensor, self.chunk_bytes)):
                codec.decode(f, c)

    def quantize(self, tensor):
        if self.policy is None or self.policy.mode == "lossless":
            return tensor
        return _quantize_chunks(tensor, self.policy, self.chunk_bytes)


def _frame_header_bytes(frame):
    """The frame header's size (docs/FORMAT.md): 24 fixed bytes, whose last 4 are the
    block count, a 4-byte size per block, and an 8-byte checksum."""
    blocks = int.from_bytes(frame[20:24], "little")
    return 24 + 4 * blocks + 8


def _join(frames):
    """Frames as one byte string: their count and sizes (8 bytes each), then the frames."""
    head = len(frames).to_bytes(8, "little") + b"".join(
        len(f).to_bytes(8, "little") for f in frames)
    return head + b"".join(frames)


def _split(joined):
    count = int.from_bytes(joined[:8], "little")
    sizes = [int.from_bytes(joined[8 + 8 * i:16 + 8 * i], "little") for i in range(count)]
    frames, at = [], 8 + 8 * count
    for n in sizes:
        frames.append(joined[at:at + n])
        at += n
    return frames


def _chunks(flat, chunk_bytes):
    """Views of a flat tensor's chunks, cut as the Client cuts them."""
    per = max(1, chunk_bytes // flat.element_size())
    return [flat[lo:lo + per] for lo in range(0, flat.numel(), per)]


def _quantize_chunks(tensor, policy, chunk_bytes):
    """What the shards receive of `tensor`: chunk by chunk, each one block, as the Client
    encodes them."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    out = torch.empty_like(flat)
    for c, o in zip(_chunks(flat, chunk_bytes), _chunks(out, chunk_bytes)):
        codec.roundtrip(c, policy, chunk_bytes, out=o)
    return out.reshape(tensor.shape)


class ClientTransport(Transport):
    """Push-pull through the parameter server's worker Client (the `_gcomp` extension).

    Keys are declared on first use with their size; every worker must use the same keys.
    Byte counts come from the Client's own counters (what its chunks carried and sent).
    """

    def __init__(self, client, policy=None, block_bytes=None):
        """`policy`: what quantize() (error feedback) assumes the shards receive. Left out,
        it is the cluster config's uplink (with a client from gcomp.cluster.connect, which
        carries its config). quantize() cuts the tensor into the config's chunks (else
        `block_bytes`, default 1 MiB, the Client's default chunk), each one block, as the
        Client does: the residual is then exactly what the shards lost."""
        # No Transport.__init__: the byte counts are the Client's.
        _check_policy("ClientTransport", policy)
        self.client = client
        config = getattr(client, "config", None)
        self.chunk_bytes = None
        if config is not None:
            # Also with a policy given: a block's error floor is relative to the block's
            # largest element, so blocks cut otherwise than the Client's chunks (one block
            # of the whole tensor) would leave a residual the shards did not lose.
            self.chunk_bytes = int(config["chunk_bytes"])
            if policy is None:
                up = config["uplink"]
                policy = policy_for(up["mode"], up["rel_bits"], up["abs_log2"])
        self.policy = policy
        self.block_bytes = block_bytes or self.chunk_bytes or codec.DEFAULT_BLOCK_BYTES
        self._declared = {}
        self._final_stats = None

    def _stats(self):
        return self._final_stats or self.client.stats()

    @property
    def raw_bytes(self):
        st = self._stats()
        return st["raw_bytes_sent"] + st["raw_bytes_received"]

    @property
    def wire_bytes(self):
        st = self._stats()
        return st["wire_bytes_sent"] + st["wire_bytes_received"]

    def key_space(self):
        # One worker's keys on one job's shards, whichever Client object pushes them (a
        # second Client of the same worker is a duplicate push to the shards).
        config = getattr(self.client, "config", None)
        worker = getattr(self.client, "worker", None)
        if config is None or worker is None:
            return ("client", id(self.client))
        return ("job", config["job"], tuple(config["shards"]), worker)

    def cuda_unsupported(self):
        from gcomp import extension
        why = extension().cuda_status()
        if why:
            return ("CUDA gradients need a usable CUDA device for the worker Client (%s); "
                    "move the model to the CPU or fix the driver" % why)
        return None

    def push_pull(self, key, step, tensor):
        # float32, bfloat16 and float16 tensors are declared with their dtype: the shards
        # aggregate each in its own format and the codec compresses it as such.
        if tensor.device.type == "cuda":
            self._push_pull_cuda(key, step, tensor)
            return
        buf, dtype = codec._as_buffer(tensor, writable=True)
        self._declare(key, tensor.numel(), dtype)
        self.client.push_pull(key, step, buf)

    def _push_pull_cuda(self, key, step, tensor):
        """In place on the device: the Client encodes and decodes with the GPU codec."""
        if not tensor.is_contiguous():
            raise ValueError("key %r: CUDA tensor must be contiguous" % key)
        dtype = codec.TORCH_DTYPES.get(tensor.dtype)
        if dtype is None:
            raise TypeError("key %r: unsupported tensor dtype %s" % (key, tensor.dtype))
        self._declare(key, tensor.numel(), dtype)
        # The gradient was written on torch's stream; the GPU codec reads it on its own.
        torch.cuda.current_stream(tensor.device).synchronize()
        with torch.cuda.device(tensor.device):
            self.client.push_pull_device(key, step, tensor.data_ptr(), tensor.data_ptr(),
                                         tensor.numel() * tensor.element_size())

    def first_step(self, key, tensor):
        """Declares `key` and returns the step its shards expect next: 0 for a fresh tensor,
        s + 1 where the shards completed step s before this process (a restarted worker or
        job on shards that kept running, or restored a checkpoint), so it goes on from
        there instead of being refused as stale."""
        dtype = codec.TORCH_DTYPES.get(tensor.dtype)
        if dtype is None:
            raise TypeError("key %r: unsupported tensor dtype %s" % (key, tensor.dtype))
        self._declare(key, tensor.numel(), dtype)
        return int(self.client.resume_step(key))

    def _declare(self, key, n, dtype):
        if key not in self._declared:
            self.client.declare(key, n, dtype)
            self._declared[key] = (n, dtype)
        elif self._declared[key] != (n, dtype):
            raise ValueError("key %r was declared as %d elements of %s, got %d of %s"
                             % (key, *self._declared[key], n, dtype))

    def quantize(self, tensor):
        if self.policy is None or self.policy.mode == "lossless":
            return tensor
        return _quantize_chunks(tensor, self.policy, self.chunk_bytes or self.block_bytes)

    def close(self):
        if self._final_stats is None:
            self._final_stats = self.client.stats()
            self.client.close()
