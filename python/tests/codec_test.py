"""The codec from Python: round trips on numpy arrays and torch tensors, the error bound,
bad input, and the shared real gradients."""
import glob
import os
import re

import numpy as np
import pytest
import torch

import gcomp

if not gcomp.have_extension():
    pytest.skip(gcomp.extension_error(), allow_module_level=True)

from gcomp import codec  # noqa: E402

ext = gcomp.extension()
LOSSLESS = codec.Policy("lossless")
NEAR = codec.Policy("near-lossless", rel_bits=7, abs_log2=-16)


def gradient_like(n, seed=0, zeros=0.3):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(n) * np.exp(rng.standard_normal(n) * 2) * 1e-3
    g[rng.random(n) < zeros] = 0
    return g.astype(np.float32)


def specials():
    bits = np.array([0x7FC00001, 0xFFC12345, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001,
                     0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x3F800000], dtype=np.uint32)
    return bits.view(np.float32)


@pytest.mark.parametrize("n", [1, 7, 1000, 300_001])
def test_lossless_round_trip_numpy_f32_is_bit_exact(n):
    x = gradient_like(n, seed=n)
    x[: min(n, 10)] = specials()[: min(n, 10)]
    out = np.empty_like(x)
    codec.decode(codec.encode(x, LOSSLESS), out)
    assert np.array_equal(out.view(np.uint32), x.view(np.uint32))


def test_lossless_round_trip_f16_and_bf16_tensors():
    x = torch.from_numpy(gradient_like(5000, seed=1))
    for t in (x.half(), x.bfloat16()):
        out, size = codec.roundtrip(t, LOSSLESS)
        assert out.dtype == t.dtype
        assert torch.equal(out.view(torch.int16), t.view(torch.int16))
        assert size > 0


def test_decode_writes_into_the_tensor_given_without_copies():
    x = torch.from_numpy(gradient_like(10_000, seed=2))
    out = torch.zeros_like(x)
    ptr = out.data_ptr()
    returned = codec.decode(codec.encode(x, LOSSLESS), out)
    assert returned is out and out.data_ptr() == ptr
    assert torch.equal(out, x)


def test_non_contiguous_tensor_is_encoded_but_rejected_as_output():
    x = torch.from_numpy(gradient_like(2000, seed=3)).view(40, 50).t()
    frame = codec.encode(x, LOSSLESS)
    out = torch.empty(50, 40)
    codec.decode(frame, out)
    assert torch.equal(out, x.contiguous())
    with pytest.raises(ValueError):
        codec.decode(frame, torch.empty(40, 50).t())


def test_a_tensor_that_requires_grad_is_not_written_in_place():
    # As torch refuses an in-place op on it (decode wrote into it, unseen by autograd).
    x = torch.from_numpy(gradient_like(100, seed=4))
    frame = codec.encode(x, LOSSLESS)
    out = torch.zeros(100, requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad cannot be written in place"):
        codec.decode(frame, out)
    assert torch.count_nonzero(out.detach()) == 0
    with torch.no_grad():
        codec.decode(frame, out)
    assert torch.equal(out.detach(), x)
    codec.encode(out)  # read, not written: taken


def test_near_lossless_stays_within_the_stated_bound():
    x = gradient_like(200_000, seed=4)  # one block: the block maximum is the array's
    out = np.empty_like(x)
    frame = codec.encode(x, NEAR)
    codec.decode(frame, out)
    m = float(np.abs(x).max())
    bound = np.array([ext.error_bound(NEAR.mode, NEAR.rel_bits, NEAR.abs_log2, float(v), m)
                      for v in x[:5000]])
    assert np.all(np.abs(out[:5000].astype(np.float64) - x[:5000]) <= bound)
    # The closed form for the rest (vectorized): max(2^-(R+1)|x|, 2^A M).
    closed = np.maximum(2.0 ** -(NEAR.rel_bits + 1) * np.abs(x.astype(np.float64)),
                        2.0 ** NEAR.abs_log2 * m)
    assert np.all(np.abs(out.astype(np.float64) - x) <= closed)
    assert np.all(np.sign(out[out != 0]) == np.sign(x[out != 0]))
    assert x.nbytes / len(frame) > 3


def test_frame_header_is_inspectable():
    x = gradient_like(1 << 19, seed=5)
    info = ext.inspect_frame(codec.encode(x, NEAR, block_bytes=1 << 18))
    assert info["elements"] == x.size and info["dtype"] == "f32" and info["blocks"] == 8


def test_bad_input_raises_value_error_not_a_crash():
    x = gradient_like(4096, seed=6)
    frame = bytearray(codec.encode(x, LOSSLESS))
    out = np.empty_like(x)
    with pytest.raises(ValueError):
        codec.decode(bytes(frame[: len(frame) // 2]), out)
    frame[len(frame) // 2] ^= 0xFF
    with pytest.raises(ValueError):
        codec.decode(bytes(frame), out)
    with pytest.raises(ValueError):
        codec.decode(codec.encode(x, LOSSLESS), np.empty(4095, np.float32))
    with pytest.raises(ValueError):
        codec.Policy("zstd")
    # The codec's ranges are refused where the policy is made, naming the field.
    for kwargs, words in (({"rel_bits": 24}, "rel_bits must be in [0, 23], got 24"),
                          ({"rel_bits": -1}, "rel_bits must be in [0, 23]"),
                          ({"abs_log2": 1}, "abs_log2 must be in [-128, 0], got 1"),
                          ({"abs_log2": -129}, "abs_log2 must be in [-128, 0]"),
                          ({"rel_bits": 7.5}, "rel_bits must be an int"),
                          ({"abs_log2": True}, "abs_log2 must be an int")):
        with pytest.raises(ValueError, match=re.escape(words)):
            codec.Policy("near-lossless", **kwargs)
    assert codec.Policy("near-lossless", rel_bits=np.int64(23), abs_log2=-128).rel_bits == 23
    with pytest.raises(ValueError):
        ext.encode(x, "f32", "near-lossless", 99, -16)
    with pytest.raises(TypeError):
        codec.encode(np.zeros(4, np.float64), LOSSLESS)


def real_gradients():
    d = os.environ.get("GCOMP_GRADIENTS_DIR", "")
    files = sorted(glob.glob(os.path.join(d, "*.npy"))) if d else []
    if not files:
        pytest.skip("no real gradients: set GCOMP_GRADIENTS_DIR to the shared gradients folder")
    return files


def test_real_gradients_lossless_exact_and_near_lossless_compresses():
    for path in real_gradients():
        g = np.load(path)
        out = np.empty_like(g)
        codec.decode(codec.encode(g, LOSSLESS, threads=2), out, threads=2)
        assert np.array_equal(out.view(np.uint32), g.view(np.uint32)), path
        frame = codec.encode(g, NEAR, threads=2)
        codec.decode(frame, out, threads=2)
        assert g.nbytes / len(frame) >= 3.0, path


def test_the_gil_is_released_while_encoding():
    import threading
    x = gradient_like(1 << 23, seed=7)
    counter, marks = [0], []

    def work():
        marks.append(counter[0])
        codec.encode(x, LOSSLESS)
        marks.append(counter[0])

    t = threading.Thread(target=work)
    t.start()
    while t.is_alive():
        counter[0] += 1
    t.join()
    # Had encode held the GIL, this thread could not have counted while it ran.
    assert marks[1] - marks[0] > 100


@pytest.mark.parametrize("kwargs, error, message", [
    ({"block_bytes": -4}, ValueError, "block_bytes must be in \\[1, 4611686018427387904\\], got -4"),
    ({"block_bytes": 0}, ValueError, "block_bytes must be in"),
    ({"block_bytes": 2**64}, ValueError, "block_bytes must be in"),
    ({"block_bytes": 4.5}, TypeError, "block_bytes must be an integer"),
    ({"threads": 0}, ValueError, "threads must be in \\[1, 2147483647\\], got 0"),
    ({"threads": -1}, ValueError, "threads must be in"),
    ({"threads": 2**31}, ValueError, "threads must be in"),
])
def test_bad_block_size_or_thread_count_is_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        codec.encode(np.ones(10, np.float32), **kwargs)


def test_decode_names_a_bad_thread_count():
    frame = codec.encode(np.ones(10, np.float32))
    with pytest.raises(ValueError, match="threads must be in"):
        codec.decode(frame, np.empty(10, np.float32), threads=0)
