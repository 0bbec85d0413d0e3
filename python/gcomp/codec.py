"""The GComp codec on numpy arrays and torch tensors.

Arrays are passed to C++ through the buffer protocol; contiguous CPU tensors go through
`tensor.numpy()` (a view), so neither side is copied. bfloat16 tensors are viewed as int16.
The GIL is released while encoding and decoding.
"""
from dataclasses import dataclass

import numpy as np

from gcomp import extension

MODES = ("lossless", "near-lossless")
DEFAULT_BLOCK_BYTES = 1 << 20


@dataclass(frozen=True)
class Policy:
    """How much precision blocks keep (see codec/codec.h `Policy`).

    near-lossless guarantees |decoded - x| <= max(2^-(rel_bits+1) |x|, 2^abs_log2 * M) for
    every finite x of a block whose largest magnitude is M.
    """
    mode: str = "near-lossless"
    rel_bits: int = 7
    abs_log2: int = -16

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError("mode must be one of %s, got %r" % (MODES, self.mode))
        # The codec's ranges (codec/dtype.cc CheckPolicyRanges), checked here so that a bad
        # value is refused where it is written, not at the first encode inside a hook.
        for name, low, high in (("rel_bits", 0, 23), ("abs_log2", -128, 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError("%s must be an int, got %r" % (name, value))
            if not low <= value <= high:
                raise ValueError("%s must be in [%d, %d], got %d" % (name, low, high, value))


def _torch_dtypes():
    torch = _torch()
    if torch is None:
        return {}
    return {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


TORCH_DTYPES = _torch_dtypes()  # torch dtype -> the codec's name ({} without torch)


def _as_buffer(x, writable=False):
    """(numpy view, dtype name) of an array or tensor, without a copy.

    Non-contiguous or non-CPU tensors are rejected for outputs and copied for inputs.
    """
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        if writable and x.requires_grad and torch.is_grad_enabled():
            # As torch refuses an in-place op on such a tensor: autograd would not see it.
            raise RuntimeError("a tensor that requires grad cannot be written in place; pass "
                               "t.detach() or write under torch.no_grad()")
        if x.device.type != "cpu" or not x.is_contiguous():
            if writable:
                raise ValueError("a tensor written in place or as the output must be a "
                                 "contiguous CPU tensor; this one is not (%s, %s)"
                                 % ("contiguous" if x.is_contiguous() else "not contiguous",
                                    x.device))
            x = x.detach().to("cpu").contiguous()
        name = TORCH_DTYPES.get(x.dtype)
        if name is None:
            raise TypeError("unsupported tensor dtype %s" % x.dtype)
        flat = x.detach().view(-1)
        if name == "bf16":
            flat = flat.view(torch.int16)  # numpy has no bfloat16
        return flat.numpy(), name
    a = np.asarray(x)
    if not a.flags.c_contiguous:
        if writable:
            raise ValueError("an array written in place or as the output must be "
                             "C-contiguous; this one is not")
        a = np.ascontiguousarray(a)
    if a.dtype == np.float32:
        return a.reshape(-1), "f32"
    if a.dtype == np.float16:
        return a.reshape(-1), "f16"
    raise TypeError("unsupported array dtype %s (use float32, float16 or a bfloat16 tensor)"
                    % a.dtype)


def _positive_int(name, value, most=2**31 - 1):
    """value as an int in [1, most], else TypeError/ValueError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError("%s must be an integer, got %s" % (name, type(value).__name__))
    if not 1 <= value <= most:
        raise ValueError("%s must be in [1, %d], got %d" % (name, most, value))
    return int(value)


def encode(x, policy=Policy(), block_bytes=DEFAULT_BLOCK_BYTES, threads=1):
    """Encodes an array or tensor into one GComp frame (bytes)."""
    block_bytes = _positive_int("block_bytes", block_bytes, most=2**62)
    threads = _positive_int("threads", threads)
    buf, dtype = _as_buffer(x)
    return extension().encode(buf, dtype, policy.mode, policy.rel_bits, policy.abs_log2,
                              block_bytes, threads)


def decode(frame, out, threads=1):
    """Decodes a frame into `out` (an array or tensor of the frame's dtype and size)."""
    threads = _positive_int("threads", threads)
    buf, dtype = _as_buffer(out, writable=True)
    extension().decode(frame, buf, dtype, threads)
    return out


def roundtrip(x, policy=Policy(), block_bytes=DEFAULT_BLOCK_BYTES, out=None, threads=1):
    """decode(encode(x)): what a receiver sees. Returns (decoded, encoded size in bytes)."""
    frame = encode(x, policy, block_bytes, threads)
    if out is None:
        torch = _torch()
        if torch is not None and isinstance(x, torch.Tensor):
            out = torch.empty_like(x, device="cpu", memory_format=torch.contiguous_format)
        else:
            out = np.empty_like(np.asarray(x), order="C")
    decode(frame, out, threads)
    return out, len(frame)


def max_encoded_bytes(n, dtype="f32", block_bytes=DEFAULT_BLOCK_BYTES):
    return extension().max_encoded_bytes(n, dtype, block_bytes)

