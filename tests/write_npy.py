#!/usr/bin/env python3
"""Writes a float32 .npy file (format 1.0) for the shell tests, without numpy:

    write_npy.py OUT N [ramp|sine|sparse-sine]

ramp: (i % 97) * 1e-3; sine: sin(0.01 i) * 1e-3; sparse-sine: the same with every 7th
element zero (so the zero map has work to do)."""
import math
import struct
import sys


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    out, n = sys.argv[1], int(sys.argv[2])
    pattern = sys.argv[3] if len(sys.argv) == 4 else "sine"
    values = {
        "ramp": lambda i: (i % 97) * 1e-3,
        "sine": lambda i: math.sin(i * 0.01) * 1e-3,
        "sparse-sine": lambda i: math.sin(i * 0.01) * 1e-3 * (i % 7 != 0),
    }
    if pattern not in values:
        sys.exit("unknown pattern %r (ramp, sine, sparse-sine)" % pattern)
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }" % n
    header += " " * (118 - len(header)) + "\n"
    with open(out, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%df" % n, *[values[pattern](i) for i in range(n)]))


if __name__ == "__main__":
    main()
