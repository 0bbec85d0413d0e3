#!/bin/bash
# End-to-end checks of the gcomp tool: round trips, inspect, and clean failures.
set -u
GCOMP="${TEST_SRCDIR}/${TEST_WORKSPACE}/gcomp"
DIR="${TEST_TMPDIR:-$(mktemp -d)}"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# Abseil, zstd, lz4 and xxHash are linked in from archives (//third_party:libs.bzl): a
# shared copy loaded as well, or gRPC/protobuf (which load shared Abseil), would mean two
# copies of Abseil in one process.
shared="$(ldd "$GCOMP" | grep -E -o 'lib(absl_[a-z_]+|grpc[a-z+_]*|protobuf|zstd|lz4|xxhash)[.]so' | sort -u | tr '\n' ' ')"
[ -z "$shared" ] || fail "gcomp loads shared libraries it should link statically: $shared"

# A small float32 .npy: zeros, specials and gradient-like values.
python3 - "$DIR/in.npy" <<'PY'
import math, random, struct, sys
random.seed(1)
vals = [0.0 if i % 3 == 0 else random.gauss(0, 1) * 2.0 ** random.randint(-20, 0)
        for i in range(300000)]
vals[5:9] = [float("inf"), -float("inf"), -0.0, 1e-42]
hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }" % len(vals)
hdr += " " * ((64 - (10 + len(hdr) + 1) % 64) % 64) + "\n"
with open(sys.argv[1], "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
    f.write(struct.pack("<%df" % len(vals), *vals))
PY

"$GCOMP" compress --mode lossless --threads 2 "$DIR/in.npy" "$DIR/a.gcz" || fail "compress lossless"
"$GCOMP" decompress --threads 2 "$DIR/a.gcz" "$DIR/a.npy" || fail "decompress"
cmp -s <(tail -c 1200000 "$DIR/in.npy") <(tail -c 1200000 "$DIR/a.npy") || fail "lossless round trip differs"

"$GCOMP" compress --rel-bits 5 --abs-log2=-12 "$DIR/in.npy" "$DIR/b.gcz" || fail "compress near-lossless"
"$GCOMP" inspect "$DIR/b.gcz" > "$DIR/b.json" || fail "inspect"
grep -q '"elements": 300000' "$DIR/b.json" || fail "inspect elements"
grep -q '"rel_bits": 5' "$DIR/b.json" || fail "inspect policy"
grep -q '"exponents"' "$DIR/b.json" || fail "inspect sections"
[ "$(stat -c %s "$DIR/b.gcz")" -lt "$(stat -c %s "$DIR/a.gcz")" ] || fail "near-lossless not smaller"

# A file of several blocks, which compress and decompress map a window of blocks at a time:
# lossless round trips on 1 and 2 threads, and the same frame from both.
python3 - "$DIR/in.npy" "$DIR/big.npy" <<'PY'
import struct, sys
raw = open(sys.argv[1], "rb").read()
data = raw[10 + struct.unpack("<H", raw[8:10])[0]:]
reps = 5
hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }" % (reps * len(data) // 4)
hdr += " " * ((64 - (10 + len(hdr) + 1) % 64) % 64) + "\n"
with open(sys.argv[2], "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + data * reps)
PY
for t in 1 2; do
  "$GCOMP" compress --mode lossless --threads "$t" "$DIR/big.npy" "$DIR/big$t.gcz" ||
    fail "compress big, $t threads"
  "$GCOMP" decompress --threads "$t" "$DIR/big$t.gcz" "$DIR/big$t.npy" ||
    fail "decompress big, $t threads"
  cmp -s <(tail -c 6000000 "$DIR/big.npy") <(tail -c 6000000 "$DIR/big$t.npy") ||
    fail "lossless round trip of the big file differs, $t threads"
done
cmp -s "$DIR/big1.gcz" "$DIR/big2.gcz" || fail "big file: 1 and 2 threads wrote different frames"
# 1.5 M elements in blocks of at most 1 MiB: 6 blocks, 3 windows on 1 thread.
"$GCOMP" inspect "$DIR/big1.gcz" | grep -q '"blocks": 6,' || fail "big file: not 6 blocks"

for dt in bf16 f16; do
  "$GCOMP" compress --dtype "$dt" --mode lossless "$DIR/in.npy" "$DIR/$dt.gcz" || fail "compress $dt"
  "$GCOMP" decompress "$DIR/$dt.gcz" "$DIR/$dt.npy" || fail "decompress $dt"
done

# Failures: one line on stderr, non-zero exit, an existing output left alone.
echo keep > "$DIR/out.npy"
head -c 500 "$DIR/a.gcz" > "$DIR/cut.gcz"
check_fails() {
  local what="$1"; shift
  if "$@" 2> "$DIR/err"; then fail "$what: exit 0"; fi
  [ "$(wc -l < "$DIR/err")" -eq 1 ] || { fail "$what: stderr not one line"; cat "$DIR/err"; }
}
check_fails "truncated input" "$GCOMP" decompress "$DIR/cut.gcz" "$DIR/out.npy"
[ "$(cat "$DIR/out.npy")" = keep ] || fail "existing output was touched"
check_fails "missing input" "$GCOMP" compress "$DIR/nope.npy" "$DIR/x.gcz"
check_fails "bad mode" "$GCOMP" compress --mode lossy "$DIR/in.npy" "$DIR/x.gcz"
check_fails "bad rel-bits" "$GCOMP" compress --rel-bits 40 "$DIR/in.npy" "$DIR/x.gcz"
check_fails "bad dtype" "$GCOMP" compress --dtype f64 "$DIR/in.npy" "$DIR/x.gcz"
check_fails "not npy" "$GCOMP" compress "$DIR/a.gcz" "$DIR/x.gcz"
check_fails "not gcz" "$GCOMP" inspect "$DIR/in.npy"
check_fails "unknown subcommand" "$GCOMP" frobnicate
# The input given as the output (also through a link) is refused and left whole.
cp "$DIR/in.npy" "$DIR/self.npy"
ln -sf "$DIR/self.npy" "$DIR/self_link.gcz"
check_fails "output is the input" "$GCOMP" compress "$DIR/in.npy" "$DIR/in.npy"
check_fails "output links to the input" "$GCOMP" compress "$DIR/self.npy" "$DIR/self_link.gcz"
cp "$DIR/a.gcz" "$DIR/self.gcz"
check_fails "decompress over its input" "$GCOMP" decompress "$DIR/self.gcz" "$DIR/self.gcz"
cmp -s "$DIR/in.npy" "$DIR/self.npy" || fail "input destroyed by compress onto itself"
cmp -s "$DIR/a.gcz" "$DIR/self.gcz" || fail "input destroyed by decompress onto itself"
grep -q "is the input file" "$DIR/err" || fail "same-file error does not say why"
# An output that is not a regular file (here a fifo, as /dev/null or /dev/full would be)
# is not replaced.
mkfifo "$DIR/fifo.gcz"
check_fails "fifo output" "$GCOMP" compress "$DIR/in.npy" "$DIR/fifo.gcz"
[ -p "$DIR/fifo.gcz" ] || fail "fifo output was replaced"
check_fails "threads too many" "$GCOMP" decompress --threads 5000 "$DIR/a.gcz" "$DIR/t.npy"
check_fails "threads negative" "$GCOMP" compress --threads -1 "$DIR/in.npy" "$DIR/x.gcz"
check_fails "repeats zero" "$GCOMP" bench --repeats 0 "$DIR/in.npy"
# Shapes whose element count wraps 64 bits, and a header giving a key twice.
python3 - "$DIR" <<'PY'
import struct, sys
def npy(path, header, data=b""):
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data)
# 1104524548 * 16701072065 = 2^64 + 4: four floats of data would match the wrapped count.
npy(sys.argv[1] + "/wrap.npy",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (1104524548, 16701072065), }",
    struct.pack("<4f", 1, 2, 3, 4))
# Nine dimensions: a .gcz holds eight (compress wrote a file decompress refused; at 257
# the header's count byte wrapped).
npy(sys.argv[1] + "/dims9.npy",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 2), }",
    struct.pack("<2f", 1, 2))
npy(sys.argv[1] + "/dup.npy",
    "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'descr': '<f8', }",
    struct.pack("<f", 1))  # right for the first descr: only the repeated key is wrong
PY
# f16 tops out at 65504: values past it become Inf, and compress says how many.
python3 - "$DIR/big_values.npy" <<'PY'
import struct, sys
vals = [1.0, 70000.0, -1e6, 2.0]
hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }"
hdr += " " * ((64 - (10 + len(hdr) + 1) % 64) % 64) + "\n"
with open(sys.argv[1], "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
    f.write(struct.pack("<4f", *vals))
PY
"$GCOMP" compress --dtype f16 "$DIR/big_values.npy" "$DIR/big_values.gcz" 2> "$DIR/warn" ||
  fail "compress f16 with large values"
grep -q "warning: 2 of 4 finite values are beyond f16's range" "$DIR/warn" ||
  { fail "no f16 overflow warning"; cat "$DIR/warn"; }
"$GCOMP" compress --dtype f16 "$DIR/in.npy" "$DIR/small_values.gcz" 2> "$DIR/warn" ||
  fail "compress f16"
[ ! -s "$DIR/warn" ] || fail "f16 warning without overflow: $(cat "$DIR/warn")"
# A .gcz whose header shape disagrees with its frame: decompress and inspect both refuse it
# (inspect printed it and exited 0).
python3 - "$DIR/a.gcz" "$DIR/reshaped.gcz" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
struct.pack_into("<Q", b, 8, struct.unpack_from("<Q", b, 8)[0] - 1)
open(sys.argv[2], "wb").write(b)
PY
check_fails "header shape not the frame's (decompress)" "$GCOMP" decompress "$DIR/reshaped.gcz" "$DIR/x.npy"
grep -q "does not match the frame" "$DIR/err" || fail "reshaped decompress: $(cat "$DIR/err")"
check_fails "header shape not the frame's (inspect)" "$GCOMP" inspect "$DIR/reshaped.gcz"
grep -q "does not match the frame" "$DIR/err" || fail "reshaped inspect: $(cat "$DIR/err")"
check_fails "wrapping shape" "$GCOMP" compress "$DIR/wrap.npy" "$DIR/x.gcz"
grep -q "too large" "$DIR/err" || fail "wrapping shape: error does not say too large"
check_fails "key given twice" "$GCOMP" compress "$DIR/dup.npy" "$DIR/x.gcz"
grep -q "twice" "$DIR/err" || fail "key given twice: error does not say so"
check_fails "nine dimensions" "$GCOMP" compress "$DIR/dims9.npy" "$DIR/x.gcz"
grep -q "9 dimensions; a .gcz holds at most 8" "$DIR/err" || fail "nine dimensions: $(cat "$DIR/err")"
[ ! -e "$DIR/x.gcz" ] || fail "output written on failure"
ls "$DIR" | grep -q tmp && fail "temporary file left behind"

"$GCOMP" bench --threads 2 --repeats 1 "$DIR/in.npy" > "$DIR/bench.txt" || fail "bench"
grep -q "zstd -1" "$DIR/bench.txt" || fail "bench output"

[ "$fails" -eq 0 ] && echo PASS
exit "$fails"
