#include "server/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/files.h"
#include "base/logging.h"
#include "cluster/cluster_config.h"
#include "cluster/shard_map.h"
#include "format/endian.h"
#include "xxhash.h"

namespace gcomp::server {
namespace {

// Data file: magic, records [u32 length][payload][u64 XXH64(payload)], trailer magic,
// u64 record count, u64 XXH64 of every byte before the trailer magic (docs/CHECKPOINT.md).
constexpr char kMagic[8] = {'G', 'C', 'K', 'P', 'T', '0', '0', '1'};
constexpr char kTrailer[8] = {'G', 'C', 'K', 'P', 'E', 'N', 'D', '1'};
constexpr uint32_t kMaxRecordBytes = 1u << 30;
constexpr char kManifestHeader[] = "gcomp-checkpoint-manifest 1";
// A manifest is a few lines, plus idle shards' indices: far under this.
constexpr uint64_t kMaxManifestBytes = 1 << 20;

void PutU32(std::string* out, uint32_t v) {
  uint8_t b[4];
  format::StoreLE32(b, v);
  out->append(reinterpret_cast<const char*>(b), sizeof(b));
}
void PutU64(std::string* out, uint64_t v) {
  uint8_t b[8];
  format::StoreLE64(b, v);
  out->append(reinterpret_cast<const char*>(b), sizeof(b));
}
uint32_t GetU32(const char* p) { return format::LoadLE32(reinterpret_cast<const uint8_t*>(p)); }
uint64_t GetU64(const char* p) { return format::LoadLE64(reinterpret_cast<const uint8_t*>(p)); }

std::string Hex(uint64_t v) { return absl::StrFormat("%016x", v); }

std::string ErrnoText() { return std::strerror(errno); }

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::Status MakeDirs(const std::string& path) {
  std::string sofar;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part.empty()) {
      if (sofar.empty()) sofar = "/";
      continue;
    }
    sofar = sofar.empty() || sofar == "/" ? absl::StrCat(sofar, part) : absl::StrCat(sofar, "/", part);
    if (::mkdir(sofar.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(absl::StrCat("cannot create directory ", sofar, ": ", ErrnoText()));
    }
  }
  return absl::OkStatus();
}

// OK when `dir` is a directory this process can list, or does not exist yet (NotFound:
// no checkpoint was ever written there); otherwise why not. A directory that cannot be
// listed must not read as an empty one: the shard would start from nothing.
absl::Status CheckDirListable(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d != nullptr) {
    ::closedir(d);
    return absl::OkStatus();
  }
  const int err = errno;
  if (err == ENOENT) return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir));
  return absl::FailedPreconditionError(
      absl::StrCat("cannot read checkpoint directory ", dir, ": ", std::strerror(err)));
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

void RemoveTree(const std::string& path) {
  for (const std::string& n : ListDir(path)) ::unlink(absl::StrCat(path, "/", n).c_str());
  ::rmdir(path.c_str());
}

std::string ShardPrefix(uint32_t shard, uint32_t shards) {
  return absl::StrCat("shard-", shard, "-of-", shards);
}

struct Manifest {
  std::string job;
  std::string set;
  int64_t step = -1;
  uint32_t shard = 0;
  uint32_t shards = 0;
  uint64_t epoch = 0;
  std::string file;
  uint64_t file_bytes = 0;
  uint64_t file_xxh64 = 0;
  std::vector<uint32_t> idle_shards;  // written only when there are some
};

std::string SerializeManifest(const Manifest& m) {
  std::string body = absl::StrCat(kManifestHeader, "\njob ", m.job, "\nset ", m.set, "\nstep ",
                                  m.step, "\nshard ", m.shard, "\nshards ", m.shards, "\nepoch ",
                                  m.epoch, "\nfile ", m.file, " ", m.file_bytes, " ",
                                  Hex(m.file_xxh64), "\n");
  // Optional, so that sets without idle shards read as before (and in older versions).
  if (!m.idle_shards.empty())
    absl::StrAppend(&body, "idle_shards ", absl::StrJoin(m.idle_shards, " "), "\n");
  return absl::StrCat(body, "end ", Hex(XXH64(body.data(), body.size(), 0)), "\n");
}

absl::StatusOr<Manifest> ParseManifest(absl::string_view text, const std::string& name) {
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest ", name, ": ", why));
  };
  size_t end = text.rfind("end ");
  if (end == absl::string_view::npos) return bad("no 'end' line (truncated?)");
  absl::string_view body = text.substr(0, end);
  absl::string_view sum = absl::StripSuffix(text.substr(end + 4), "\n");
  if (sum != Hex(XXH64(body.data(), body.size(), 0))) return bad("checksum mismatch");
  std::vector<std::string> lines = absl::StrSplit(body, '\n', absl::SkipEmpty());
  if ((lines.size() != 8 && lines.size() != 9) || lines[0] != kManifestHeader) {
    return bad("unexpected header or line count");
  }
  Manifest m;
  std::map<std::string, std::string> kv;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::pair<std::string, std::string> p = absl::StrSplit(lines[i], absl::MaxSplits(' ', 1));
    kv[p.first] = p.second;
  }
  m.job = kv["job"];
  m.set = kv["set"];
  std::vector<std::string> file = absl::StrSplit(kv["file"], ' ');
  if (m.job.empty() || m.set.empty() || file.size() != 3 || !absl::SimpleAtoi(kv["step"], &m.step) ||
      !absl::SimpleAtoi(kv["shard"], &m.shard) || !absl::SimpleAtoi(kv["shards"], &m.shards) ||
      !absl::SimpleAtoi(kv["epoch"], &m.epoch) || !absl::SimpleAtoi(file[1], &m.file_bytes) ||
      !absl::SimpleHexAtoi(file[2], &m.file_xxh64)) {
    return bad("missing or malformed field");
  }
  m.file = file[0];
  if (m.shards == 0 || m.shard >= m.shards || m.file.find('/') != std::string::npos ||
      m.file.empty() || m.file[0] == '.') {
    return bad("shard index, shard count or file name out of range");
  }
  if (lines.size() == 9) {
    auto idle = kv.find("idle_shards");
    if (idle == kv.end()) return bad("unexpected line");
    for (absl::string_view part : absl::StrSplit(idle->second, ' ')) {
      uint32_t k = 0;
      if (!absl::SimpleAtoi(part, &k) || k >= m.shards || k == m.shard ||
          (!m.idle_shards.empty() && k <= m.idle_shards.back())) {
        return bad("idle_shards must list other shards of the set, ascending");
      }
      m.idle_shards.push_back(k);
    }
  }
  return m;
}

struct SetInfo {
  std::string name;
  std::string path;
  bool final = false;
  uint32_t shards = 0;
  int64_t step = -1;
  std::vector<Manifest> manifests;  // one per shard when complete
  std::string problem;              // why it is incomplete (empty: complete)
  std::vector<uint32_t> missing;    // shards whose manifest is absent (idle ones excepted)
  // No shard wrote its manifest: a first checkpoint interrupted before any shard finished.
  // Nothing of it was ever committed, so it is passed over, not counted as damage.
  bool never_written = false;
};

// Parses "step-NNN-of-S" / "final-of-S"; false for other names, and for shard counts no
// config allows (a stray "final-of-4000000000" would have every listing try to read 4e9
// manifests).
bool ParseSetName(const std::string& name, bool* final, int64_t* step, uint32_t* shards) {
  std::vector<std::string> parts = absl::StrSplit(name, '-');
  const auto shards_ok = [&](const std::string& text) {
    return absl::SimpleAtoi(text, shards) && *shards > 0 &&
           *shards <= static_cast<uint32_t>(cluster::kMaxShards);
  };
  if (parts.size() == 3 && parts[0] == "final" && parts[1] == "of") {
    *final = true;
    *step = -1;
    return shards_ok(parts[2]);
  }
  if (parts.size() == 4 && parts[0] == "step" && parts[2] == "of") {
    *final = false;
    return absl::SimpleAtoi(parts[1], step) && *step >= 0 && shards_ok(parts[3]);
  }
  return false;
}

// Every set in dir with its manifests read (not the data files), newest first.
std::vector<SetInfo> ListSets(const std::string& dir) {
  std::vector<SetInfo> sets;
  for (const std::string& name : ListDir(dir)) {
    SetInfo s;
    s.name = name;
    s.path = absl::StrCat(dir, "/", name);
    if (!ParseSetName(name, &s.final, &s.step, &s.shards)) continue;
    int64_t latest = -1;
    std::vector<uint32_t> absent;  // no manifest file; s.missing: those of them not idle
    for (uint32_t k = 0; k < s.shards && s.problem.empty(); ++k) {
      const std::string mname = absl::StrCat(ShardPrefix(k, s.shards), ".manifest");
      const std::string mpath = absl::StrCat(s.path, "/", mname);
      absl::StatusOr<std::string> text = ReadFile(mpath, kMaxManifestBytes);
      if (absl::IsNotFound(text.status())) {
        absent.push_back(k);
        continue;
      }
      if (!text.ok()) {  // there, but unreadable: damage, never a manifest not yet written
        s.problem = absl::StrCat("checkpoint manifest ", mpath,
                                 " cannot be read: ", text.status().message());
        break;
      }
      absl::StatusOr<Manifest> m = ParseManifest(*text, mpath);
      if (!m.ok()) {
        s.problem = std::string(m.status().message());
        break;
      }
      if (m->set != name || m->shard != k || m->shards != s.shards ||
          (!s.final && m->step != s.step)) {
        s.problem = absl::StrCat("checkpoint manifest ", mpath, ": names set '", m->set, "' shard ",
                                 m->shard, " of ", m->shards, " step ", m->step,
                                 ", not where it lies");
        break;
      }
      if (!s.manifests.empty() && (m->job != s.manifests[0].job || m->epoch != s.manifests[0].epoch)) {
        s.problem = absl::StrCat("checkpoint manifest ", mpath,
                                 ": job or epoch differs from shard ", s.manifests[0].shard, "'s");
        break;
      }
      latest = std::max(latest, m->step);
      s.manifests.push_back(*std::move(m));
    }
    // A missing manifest is no gap when a shard that wrote one names its shard idle (it
    // owned no chunk, so it completed no step). LoadSet still checks every chunk is there.
    if (s.problem.empty()) {  // a damaged manifest is the set's problem, not the missing ones
      for (uint32_t k : absent) {
        const bool idle =
            std::any_of(s.manifests.begin(), s.manifests.end(), [k](const Manifest& m) {
              return std::binary_search(m.idle_shards.begin(), m.idle_shards.end(), k);
            });
        if (!idle) s.missing.push_back(k);
      }
      if (!s.missing.empty()) {
        s.problem = absl::StrCat("incomplete: ", s.path, "/", ShardPrefix(s.missing[0], s.shards),
                                 ".manifest is missing");
        s.never_written = s.manifests.empty();
      }
    }
    if (s.final) s.step = latest;
    sets.push_back(std::move(s));
  }
  // Newest first; a final set wins a tie. A final set whose step no manifest told may be
  // the newest: it comes first, so that a restore names its problem rather than passing
  // it over unseen for an older set.
  const auto order = [](const SetInfo& s) {
    const bool unknown = s.final && s.step < 0 && !s.problem.empty();
    return unknown ? std::numeric_limits<int64_t>::max() : s.step;
  };
  std::sort(sets.begin(), sets.end(), [&order](const SetInfo& a, const SetInfo& b) {
    if (order(a) != order(b)) return order(a) > order(b);
    if (a.final != b.final) return a.final;
    return a.name > b.name;
  });
  return sets;
}

// How many periodic sets in a row a shard must have missed to be reported: one set behind
// is a shard still writing, two may be a slow disk.
constexpr size_t kStalledSets = 3;

// The shards of `shards` that wrote none of the newest kStalledSets periodic sets of that
// shard count, when none of those sets is complete: a warning naming them, or "".
std::string StalledShardsWarning(const std::vector<SetInfo>& sets, uint32_t shards) {
  std::vector<const SetInfo*> run;
  for (const SetInfo& s : sets) {
    if (s.final || s.shards != shards) continue;
    if (s.problem.empty()) break;  // complete: no shard is behind it
    run.push_back(&s);
    if (run.size() == kStalledSets) break;
  }
  if (run.size() < kStalledSets) return "";
  std::vector<uint32_t> stalled = run[0]->missing;  // ascending, as are the others
  for (const SetInfo* s : run) {
    std::vector<uint32_t> both;
    std::set_intersection(stalled.begin(), stalled.end(), s->missing.begin(), s->missing.end(),
                          std::back_inserter(both));
    stalled = std::move(both);
  }
  if (stalled.empty()) return "";
  return absl::StrCat(
      "shard", stalled.size() > 1 ? "s " : " ", absl::StrJoin(stalled, ", "), " of ", shards,
      " wrote none of the last ", kStalledSets, " periodic checkpoint sets (steps ",
      run.back()->step, " to ", run.front()->step,
      "), so none of them is complete: a shard that is down or far behind does this, and so "
      "does one whose chunks all belong to keys no longer pushed (docs/CHECKPOINT.md); the "
      "final set written at SIGTERM still holds every chunk");
}

absl::Status CheckDeclaration(const proto::TensorDeclaration& d, const std::string& name) {
  if (d.key().empty() || d.dtype() < proto::DTYPE_F32 || d.dtype() > proto::DTYPE_F16 ||
      d.elements() == 0 || d.elements() > cluster::kMaxTensorElements || d.chunk_bytes() < 4 ||
      d.chunk_bytes() > (uint64_t{1} << 28)) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", name, ": declaration of '", d.key(),
                                            "' has out-of-range fields"));
  }
  return absl::OkStatus();
}

// The layout of a declared tensor's chunks.
cluster::ChunkLayout LayoutOf(const proto::TensorDeclaration& d) {
  return cluster::ChunkLayout(d.elements(), d.dtype() == proto::DTYPE_F32 ? 4 : 2, d.chunk_bytes());
}

absl::Status LoadSet(const SetInfo& s, const LoadOptions& options, LoadedCheckpoint* out) {
  out->path = s.path;
  out->job = s.manifests[0].job;
  out->final = s.final;
  out->step = s.step;
  out->shards = s.shards;
  out->shard_map_epoch = s.manifests[0].epoch;
  absl::flat_hash_map<std::string, proto::TensorDeclaration> decls;
  absl::flat_hash_set<std::pair<std::string, uint32_t>> seen;
  absl::flat_hash_map<std::string, uint64_t> counts;
  // A chunk whose declaration is in a later file (none of today's writers does that): held
  // until every file was read.
  std::vector<proto::ChunkState> undeclared;
  // Checks a chunk against its declaration and keeps it if asked to.
  auto take = [&](const proto::TensorDeclaration& d, proto::ChunkState&& c) -> absl::Status {
    const cluster::ChunkLayout layout = LayoutOf(d);
    if (c.chunk() >= layout.num_chunks || c.elements() != layout.size(c.chunk())) {
      return absl::DataLossError(absl::StrCat("checkpoint ", s.path, ": chunk ", c.chunk(), " of '",
                                              c.key(), "' does not fit its declaration"));
    }
    ++counts[c.key()];
    if (options.keep) {
      absl::StatusOr<bool> keep = options.keep(d, &c);
      if (!keep.ok()) return keep.status();
      if (!*keep) return absl::OkStatus();
    }
    out->chunks.push_back(std::move(c));
    return absl::OkStatus();
  };
  for (const Manifest& m : s.manifests) {
    const std::string path = absl::StrCat(s.path, "/", m.file);
    // Read no more than the manifest says it holds (a sparse file of terabytes, a device).
    absl::StatusOr<std::string> bytes = ReadFile(path, m.file_bytes);
    if (absl::IsFailedPrecondition(bytes.status())) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", path, " holds more than the ",
                                              m.file_bytes, " bytes its manifest says"));
    }
    if (!bytes.ok()) return absl::DataLossError(absl::StrCat("checkpoint file ", path, " is missing"));
    if (bytes->size() != m.file_bytes) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", path, " holds ", bytes->size(),
                                              " bytes; its manifest says ", m.file_bytes));
    }
    if (XXH64(bytes->data(), bytes->size(), 0) != m.file_xxh64) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", path,
                                              ": checksum does not match its manifest"));
    }
    out->bytes += bytes->size();
    absl::Status read = ForEachCheckpointRecord(*bytes, path, [&](proto::CheckpointRecord& r) {
      if (r.has_declaration()) {
        const proto::TensorDeclaration& d = r.declaration();
        if (d.job() != out->job) {
          return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": declaration of '",
                                                  d.key(), "' belongs to job '", d.job(), "'"));
        }
        auto [it, inserted] = decls.emplace(d.key(), d);
        if (!inserted && it->second.SerializeAsString() != d.SerializeAsString()) {
          return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": declaration of '",
                                                  d.key(), "' differs from another shard's"));
        }
        return absl::OkStatus();
      }
      proto::ChunkState& c = *r.mutable_chunk();
      if (c.job() != out->job) {
        return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": chunk of '", c.key(),
                                                "' belongs to job '", c.job(), "'"));
      }
      if (!seen.insert({c.key(), c.chunk()}).second) {
        return absl::DataLossError(absl::StrCat("checkpoint file ", path, ": '", c.key(),
                                                "' chunk ", c.chunk(), " appears twice"));
      }
      auto d = decls.find(c.key());
      if (d == decls.end()) {
        undeclared.push_back(std::move(c));
        return absl::OkStatus();
      }
      return take(d->second, std::move(c));
    });
    if (!read.ok()) return read;
  }
  for (proto::ChunkState& c : undeclared) {
    auto d = decls.find(c.key());
    if (d == decls.end()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", s.path, ": chunk ", c.chunk(), " of '",
                                              c.key(), "' has no declaration"));
    }
    if (absl::Status st = take(d->second, std::move(c)); !st.ok()) return st;
  }
  for (auto& [key, d] : decls) {
    const uint64_t chunks = LayoutOf(d).num_chunks;
    if (counts[key] != chunks) {
      return absl::DataLossError(absl::StrCat("checkpoint ", s.path, ": '", key, "' has ",
                                              counts[key], " of its ", chunks, " chunks"));
    }
    out->declarations.push_back(std::move(d));
  }
  std::sort(out->declarations.begin(), out->declarations.end(),
            [](const auto& a, const auto& b) { return a.key() < b.key(); });
  return absl::OkStatus();
}

}  // namespace

std::string CheckpointSetName(bool final, int64_t step, uint32_t shards) {
  if (final) return absl::StrCat("final-of-", shards);
  return absl::StrFormat("step-%012d-of-%d", step, shards);
}

std::string SerializeCheckpointFile(const std::vector<proto::CheckpointRecord>& records) {
  size_t total = sizeof(kMagic) + sizeof(kTrailer) + 16;
  for (const proto::CheckpointRecord& r : records) total += 12 + r.ByteSizeLong();
  std::string out;
  out.reserve(total);
  out.append(kMagic, sizeof(kMagic));
  for (const proto::CheckpointRecord& r : records) {
    const size_t len = r.GetCachedSize();
    PutU32(&out, static_cast<uint32_t>(len));
    const size_t at = out.size();
    out.resize(at + len);
    r.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(&out[at]));
    PutU64(&out, XXH64(out.data() + at, len, 0));
  }
  const uint64_t body_hash = XXH64(out.data(), out.size(), 0);
  out.append(kTrailer, sizeof(kTrailer));
  PutU64(&out, records.size());
  PutU64(&out, body_hash);
  return out;
}

absl::Status ForEachCheckpointRecord(
    absl::string_view bytes, const std::string& name,
    const std::function<absl::Status(proto::CheckpointRecord&)>& visit) {
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", name, ": ", why));
  };
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return bad("not a checkpoint file (bad magic)");
  }
  constexpr size_t kTrailerBytes = sizeof(kTrailer) + 16;
  if (bytes.size() < sizeof(kMagic) + kTrailerBytes) return bad("truncated (no trailer)");
  const size_t body_end = bytes.size() - kTrailerBytes;
  const char* t = bytes.data() + body_end;
  if (std::memcmp(t, kTrailer, sizeof(kTrailer)) != 0) return bad("truncated (no trailer)");
  const uint64_t count = GetU64(t + 8);
  if (XXH64(bytes.data(), body_end, 0) != GetU64(t + 16)) return bad("file checksum mismatch");
  uint64_t seen = 0;
  size_t pos = sizeof(kMagic);
  while (pos < body_end) {
    if (body_end - pos < 4) return bad(absl::StrCat("record at byte ", pos, " truncated"));
    const uint32_t len = GetU32(bytes.data() + pos);
    pos += 4;
    if (len > kMaxRecordBytes || body_end - pos < uint64_t{len} + 8) {
      return bad(absl::StrCat("record at byte ", pos - 4, " of ", len, " bytes runs past the end"));
    }
    absl::string_view payload = bytes.substr(pos, len);
    if (XXH64(payload.data(), payload.size(), 0) != GetU64(bytes.data() + pos + len)) {
      return bad(absl::StrCat("record ", seen, " checksum mismatch"));
    }
    proto::CheckpointRecord r;
    if (!r.ParseFromArray(payload.data(), static_cast<int>(payload.size())) ||
        r.record_case() == proto::CheckpointRecord::RECORD_NOT_SET) {
      return bad(absl::StrCat("record ", seen, " does not parse"));
    }
    if (r.has_declaration()) {
      absl::Status s = CheckDeclaration(r.declaration(), name);
      if (!s.ok()) return s;
    }
    ++seen;
    pos += len + 8;
    if (seen > count) break;  // the trailer's count is wrong: said below, before any visit
    if (absl::Status s = visit(r); !s.ok()) return s;
  }
  if (seen != count) {
    return bad(absl::StrCat("trailer counts ", count, " records, found ", seen,
                            seen > count ? " or more" : ""));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<proto::CheckpointRecord>> ParseCheckpointFile(absl::string_view bytes,
                                                                         const std::string& name) {
  std::vector<proto::CheckpointRecord> records;
  absl::Status s = ForEachCheckpointRecord(bytes, name, [&](proto::CheckpointRecord& r) {
    records.push_back(std::move(r));
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return records;
}

absl::Status CheckCheckpointDirWritable(const std::string& dir) {
  // MakeDirs passes over an existing file of the name; opendir below names that case.
  if (absl::Status st = MakeDirs(dir); !st.ok()) return st;
  if (absl::Status st = CheckDirListable(dir); !st.ok()) return st;
  // A file made and removed: also right for root, whom access(2) never refuses, and for a
  // read-only mount.
  const std::string probe = absl::StrCat(dir, "/.write-probe-", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write checkpoints into ", dir, ": ", ErrnoText()));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> WriteShardCheckpoint(const std::string& dir, ShardCheckpoint c,
                                              uint32_t keep) {
  const std::string set = CheckpointSetName(c.final, c.step, c.shards);
  const std::string set_path = absl::StrCat(dir, "/", set);
  absl::Status s = MakeDirs(set_path);
  if (!s.ok()) return s;
  std::vector<proto::CheckpointRecord> records;
  records.reserve(c.declarations.size() + c.chunks.size());
  for (proto::TensorDeclaration& d : c.declarations) {
    records.emplace_back().mutable_declaration()->Swap(&d);
  }
  for (proto::ChunkState& st : c.chunks) records.emplace_back().mutable_chunk()->Swap(&st);
  c.chunks.clear();
  const std::string bytes = SerializeCheckpointFile(records);
  records.clear();
  const std::string prefix = ShardPrefix(c.shard, c.shards);
  Manifest m;
  m.job = c.job;
  m.set = set;
  m.step = c.step;
  m.shard = c.shard;
  m.shards = c.shards;
  m.epoch = c.shard_map_epoch;
  m.file_bytes = bytes.size();
  m.file_xxh64 = XXH64(bytes.data(), bytes.size(), 0);
  m.idle_shards = std::move(c.idle_shards);
  // A fresh name per write, so a manifest always names a file that was complete when it was
  // written (the final set is rewritten in place).
  std::random_device rd;
  // Each file reaches the disk, and its name the directory, before the call returns: the
  // manifest names a data file that a power loss cannot take back.
  AtomicWriteOptions durable;
  durable.fsync = true;
  const auto write_files = [&]() -> absl::Status {
    m.file = absl::StrCat(prefix, "-", Hex((uint64_t{rd()} << 32) | rd()), ".ckpt");
    if (absl::Status st = WriteFileAtomically(absl::StrCat(set_path, "/", m.file), bytes, durable);
        !st.ok()) {
      return st;
    }
    return WriteFileAtomically(absl::StrCat(set_path, "/", prefix, ".manifest"),
                               SerializeManifest(m), durable);
  };
  s = write_files();
  if (!s.ok() && !IsDirectory(set_path)) {
    // Another shard's clean-up removed the set meanwhile: an old final set this shard is
    // rewriting, or one no shard had finished. Made again, it holds this shard's files.
    log::Warn("checkpoint: {} was removed while shard {} wrote it ({}); writing it again", set_path,
              c.shard, std::string(s.message()));
    s = MakeDirs(set_path);
    if (s.ok()) s = write_files();
  }
  if (!s.ok()) return s;
  // This shard's older data files in the set (a rewritten final set).
  for (const std::string& n : ListDir(set_path)) {
    if (n != m.file && absl::StartsWith(n, prefix + "-") && absl::EndsWith(n, ".ckpt")) {
      ::unlink(absl::StrCat(set_path, "/", n).c_str());
    }
  }
  // Keep the newest `keep` complete sets; delete every set older than the oldest kept one.
  // Of the incomplete periodic sets newer than that, keep the newest keep + 1 (sets other
  // shards are still writing): a shard that never writes (down, or its sets skipped) would
  // otherwise leave one more set on disk at every boundary, for good.
  std::vector<SetInfo> sets = ListSets(dir);
  if (!c.final) {
    static log::LineBudget* const budget = new log::LineBudget(1, "stalled checkpoint warnings");
    if (std::string stalled = StalledShardsWarning(sets, c.shards);
        !stalled.empty() && budget->Admit()) {
      log::Warn("checkpoint: {}", stalled);
    }
  }
  uint32_t complete = 0, incomplete = 0;
  for (const SetInfo& info : sets) {
    // A final set with no manifest yet is most likely being written now, by a shard that
    // stops alone (SIGTERM) while this one trains on: left to it (one per shard count).
    if (info.final && info.never_written) continue;
    const bool extra_incomplete = !info.final && !info.problem.empty() && ++incomplete > keep + 1;
    if ((complete >= keep || extra_incomplete) && info.name != set) {
      log::Info("checkpoint: deleting {} set {}", complete >= keep ? "old" : "incomplete",
                info.path);
      RemoveTree(info.path);
      continue;
    }
    if (info.problem.empty()) ++complete;
  }
  return bytes.size();
}

std::vector<CheckpointSetSummary> ListCheckpointSets(const std::string& dir) {
  std::vector<CheckpointSetSummary> out;
  for (const SetInfo& s : ListSets(dir)) {
    out.push_back(CheckpointSetSummary{s.path, s.final, s.step, s.shards, s.problem});
  }
  return out;
}

std::string StalledCheckpointShards(const std::string& dir, uint32_t shards) {
  return StalledShardsWarning(ListSets(dir), shards);
}

std::pair<std::string, bool> DescribeCheckpoints(const std::string& dir) {
  std::string text = absl::StrCat("checkpoint directory ", dir, "\n");
  if (absl::Status st = CheckDirListable(dir); !st.ok()) {
    return {absl::StrCat(text, st.message(), "\n"), false};
  }
  const std::vector<SetInfo> sets = ListSets(dir);
  if (sets.empty()) return {absl::StrCat(text, "no checkpoint sets\n"), false};
  absl::StrAppend(&text, absl::StrFormat("%-32s %14s %7s  %s\n", "set", "step", "shards", "state"));
  for (const SetInfo& s : sets) {
    absl::StrAppend(&text, absl::StrFormat("%-32s %14d %7d  %s\n", s.name, s.step, s.shards,
                                           s.problem.empty() ? "complete" : s.problem));
  }
  // The shard count of the newest periodic set: the one training writes now.
  for (const SetInfo& s : sets) {
    if (s.final) continue;
    if (std::string stalled = StalledShardsWarning(sets, s.shards); !stalled.empty()) {
      absl::StrAppend(&text, "warning: ", stalled, "\n");
    }
    break;
  }
  absl::StatusOr<LoadedCheckpoint> c = LoadLatestCheckpoint(dir);
  if (!c.ok()) return {absl::StrCat(text, "no usable set: ", c.status().ToString(), "\n"), false};
  absl::StrAppend(&text, "\nnewest usable set: ", c->path, "\n  job '", c->job, "', shard-map epoch ",
                  c->shard_map_epoch, ", written by ", c->shards, " shards, ", c->bytes, " bytes, ",
                  c->declarations.size(), " tensors, ", c->chunks.size(), " chunks\n");
  for (const std::string& why : c->skipped) absl::StrAppend(&text, "  newer set skipped: ", why, "\n");
  absl::StrAppend(&text, absl::StrFormat("  %-24s %-6s %12s %-9s %7s %s\n", "tensor", "dtype", "elements",
                                         "optimizer", "chunks", "completed steps"));
  for (const proto::TensorDeclaration& d : c->declarations) {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    uint64_t chunks = 0;
    for (const proto::ChunkState& st : c->chunks) {
      if (st.key() != d.key()) continue;
      ++chunks;
      lo = std::min(lo, st.completed_step());
      hi = std::max(hi, st.completed_step());
    }
    absl::StrAppend(&text, absl::StrFormat("  %-24s %-6s %12d %-9s %7d %s\n", d.key(),
                                           proto::DType_Name(d.dtype()).substr(6), d.elements(),
                                           d.optimizer().name(), chunks,
                                           lo == hi ? absl::StrCat(lo) : absl::StrCat(lo, "..", hi)));
  }
  return {text, true};
}

absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(
    const std::string& dir, const std::function<absl::Status(const LoadedCheckpoint&)>& accept) {
  LoadOptions options;
  options.accept = accept;
  return LoadLatestCheckpoint(dir, options);
}

absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& dir,
                                                      const LoadOptions& options) {
  if (absl::Status st = CheckDirListable(dir); !st.ok()) return st;
  std::vector<SetInfo> sets = ListSets(dir);
  if (sets.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir));
  std::vector<std::string> skipped;
  for (const SetInfo& s : sets) {
    if (s.never_written) {
      log::Warn("checkpoint: passing over set {}: no shard finished writing it", s.path);
      continue;
    }
    if (!s.problem.empty()) {
      skipped.push_back(s.problem);
      log::Warn("checkpoint: skipping set {}: {}", s.path, s.problem);
      continue;
    }
    if (options.begin_set) options.begin_set();
    LoadedCheckpoint loaded;
    absl::Status st = LoadSet(s, options, &loaded);
    if (st.ok() && options.accept) st = options.accept(loaded);
    if (!st.ok()) {
      skipped.push_back(std::string(st.message()));
      log::Warn("checkpoint: skipping set {}: {}", s.path, std::string(st.message()));
      continue;
    }
    loaded.skipped = std::move(skipped);
    return loaded;
  }
  if (skipped.empty()) {  // only sets that were never written
    return absl::NotFoundError(absl::StrCat("no completed checkpoint in ", dir));
  }
  return absl::DataLossError(absl::StrCat("no usable checkpoint in ", dir, ": ",
                                          absl::StrJoin(skipped, "; ")));
}

}  // namespace gcomp::server
