// Pieces the fuzz targets share (docs/FUZZING.md): checksum repair, so that mutated inputs
// get past the integrity checks to the parsing behind them, the shared code table the
// corpora refer to, and the property check that turns a broken promise into a crash.
// Thread-compatible; for the fuzz targets and the seed writer only.
#ifndef GCOMP_FUZZ_FUZZ_SUPPORT_H_
#define GCOMP_FUZZ_FUZZ_SUPPORT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "codec/codec.h"

namespace gcomp::fuzz {

// Aborts (a crash the fuzzer reports) with `what` when `ok` is false: a promise of the code
// under test was broken even though nothing overflowed.
void Check(bool ok, absl::string_view what);
// The same for a status that must be one of the codes listed in `allowed`.
void CheckCode(const absl::Status& status, std::initializer_list<absl::StatusCode> allowed,
               absl::string_view what);

// Rewrites the block checksum (bytes 48..55, docs/FORMAT.md) of the block at `block` to
// match its other bytes. Blocks shorter than the header are left alone.
void RepairBlockChecksum(uint8_t* block, size_t size);

// Rewrites the frame header checksum and the checksum of every block the header's size
// table places inside `frame`, as far as the bytes reach.
void RepairFrameChecksums(std::string* frame);

// Turns off protobuf's error log (a parse of invalid UTF-8 logs a line; the fuzzer makes
// millions of them). Idempotent.
void SilenceProtobufLog();

// A code table built from a fixed sample; blocks of the corpora refer to it by id.
const codec::CodeTable& SharedTable();
// A store holding SharedTable(), for the decoders.
const codec::CodeTableStore& SharedTables();

// The decoded element count above which the targets only inspect (so that one input
// cannot make the fuzzer allocate hundreds of MiB legitimately).
inline constexpr size_t kMaxDecodeElements = size_t{1} << 16;

}  // namespace gcomp::fuzz

#endif  // GCOMP_FUZZ_FUZZ_SUPPORT_H_
