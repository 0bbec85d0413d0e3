// Checkpoint files of shard state (format: docs/CHECKPOINT.md). Each shard writes, into a
// directory shared by all shards, one data file of records (every declaration, then the
// ChunkState of every chunk it owns) and a manifest naming that file with its size and
// XXH64; a checkpoint ("set") is complete when the manifests of all S shards are present.
// Records are keyed by (job, key, chunk), never by shard, so a set written by S shards
// restores into any number of shards: each loads the chunks it owns under its own map.
// Thread-safe free functions; concurrent writers must write different (set, shard) pairs.
#ifndef GCOMP_SERVER_CHECKPOINT_H_
#define GCOMP_SERVER_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/chunk_state.pb.h"

namespace gcomp::server {

// What one shard writes into one set.
struct ShardCheckpoint {
  std::string job;
  // Periodic sets are named after the step boundary they hold; the one written at SIGTERM
  // is the set "final" (chunks each at their last completed step).
  bool final = false;
  int64_t step = -1;  // periodic: the step every chunk completed; final: the latest one
  uint32_t shard = 0;
  uint32_t shards = 1;
  uint64_t shard_map_epoch = 1;
  std::vector<proto::TensorDeclaration> declarations;
  std::vector<proto::ChunkState> chunks;
  // Shards of the set's map that own no chunk (ascending): a shard without chunks completes
  // no step, so it writes no periodic manifest; the set is complete without theirs.
  std::vector<uint32_t> idle_shards;
};

// The set directory's name, e.g. "step-000000000010-of-2" or "final-of-3".
std::string CheckpointSetName(bool final, int64_t step, uint32_t shards);

// Writes the shard's data file (temporary name, fsync, rename), then its manifest the same
// way, then fsyncs the directory; then deletes sets beyond the newest `keep` complete ones.
// Returns the bytes written. Errors name the file.
absl::StatusOr<uint64_t> WriteShardCheckpoint(const std::string& dir, ShardCheckpoint c,
                                              uint32_t keep);

// A data file's records; DataLoss naming `name` and the problem for any damage (bad magic,
// truncation, a record checksum, an unparsable record, a bad trailer). Never crashes.
absl::StatusOr<std::vector<proto::CheckpointRecord>> ParseCheckpointFile(absl::string_view bytes,
                                                                         const std::string& name);
// The same, one record at a time: `visit` sees each record as it is read (and may take it
// apart); its first error stops the reading and is returned. A file found damaged further
// on returns DataLoss after the records before were visited.
absl::Status ForEachCheckpointRecord(
    absl::string_view bytes, const std::string& name,
    const std::function<absl::Status(proto::CheckpointRecord&)>& visit);
// The bytes of a data file holding `records` (the inverse of ParseCheckpointFile).
std::string SerializeCheckpointFile(const std::vector<proto::CheckpointRecord>& records);

// A complete, intact set, merged over its shards' files.
struct LoadedCheckpoint {
  std::string path;  // the set directory
  std::string job;
  bool final = false;
  int64_t step = -1;
  uint32_t shards = 0;
  uint64_t shard_map_epoch = 0;
  uint64_t bytes = 0;  // data file bytes read
  std::vector<proto::TensorDeclaration> declarations;  // one per key
  // One per (key, chunk) of the set, or, with LoadOptions::keep, those it kept.
  std::vector<proto::ChunkState> chunks;
  // Newer sets passed over, each with the file and the problem.
  std::vector<std::string> skipped;
};

// The newest complete and intact set in `dir` (the final set wins a tie with a periodic
// one). NotFound when `dir` does not exist or holds no set at all, or only sets that no
// shard finished writing (no manifest at all: passed over); FailedPrecondition when
// it cannot be listed (not a directory, no permission); DataLoss listing every set's
// problem when none is usable. Damaged sets are skipped (named in `skipped`), never partly loaded.
// `accept`, where given, checks each set read before it is returned: one it refuses is
// skipped like a damaged set (named in `skipped`), and the next older one is tried.
absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(
    const std::string& dir,
    const std::function<absl::Status(const LoadedCheckpoint&)>& accept = nullptr);

// How a restoring shard reads a set: every record is still read and checked (the files'
// checksums, every chunk present exactly once and fitting its declaration, declarations
// agreeing), one file at a time, but only the chunk states it keeps stay in memory, instead
// of the whole set (every shard's files) at once.
struct LoadOptions {
  // As LoadLatestCheckpoint's `accept`, after the set was read.
  std::function<absl::Status(const LoadedCheckpoint&)> accept;
  // Called for each chunk record with its tensor's declaration: whether to keep it in
  // LoadedCheckpoint::chunks (it may take the record apart first, e.g. drop arrays it has
  // decoded elsewhere); an error skips the set like damage. Unset: keep all.
  std::function<absl::StatusOr<bool>(const proto::TensorDeclaration&, proto::ChunkState*)> keep;
  // Called before each set is read, so that what `keep` gathered from a set passed over
  // can be dropped.
  std::function<void()> begin_set;
};
absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& dir,
                                                      const LoadOptions& options);

// Creates `dir` if needed and checks that this process can write checkpoints into it:
// FailedPrecondition or PermissionDenied naming the directory and the reason.
absl::Status CheckCheckpointDirWritable(const std::string& dir);

// A set as its manifests describe it (data files not read).
struct CheckpointSetSummary {
  std::string path;
  bool final = false;
  int64_t step = -1;
  uint32_t shards = 0;
  std::string problem;  // empty: complete (all manifests present and agreeing)
};
// Every set in `dir`, newest first (the order LoadLatestCheckpoint tries them in).
std::vector<CheckpointSetSummary> ListCheckpointSets(const std::string& dir);

// When none of the newest three periodic sets of `shards` shards in `dir` is complete: a
// warning naming the shards that wrote none of them (down, far behind, or owning only keys
// no longer pushed). Otherwise "". Shards log it when they write a periodic set.
std::string StalledCheckpointShards(const std::string& dir, uint32_t shards);

// A listing of `dir` for operators: every set (complete or why not), then what the newest
// usable one holds: job, epoch, bytes, and per tensor dtype, elements, optimizer, chunks
// and the range of their completed steps, with StalledCheckpointShards' warning for the
// newest periodic sets. Second: whether a usable set exists.
std::pair<std::string, bool> DescribeCheckpoints(const std::string& dir);

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_CHECKPOINT_H_
