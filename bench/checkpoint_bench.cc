// Checkpoint write and restore speed next to `cp` of the same files, in the same run.
//   bazel run -c opt //bench:checkpoint_bench -- [--gradients A.npy,B.npy] [--copies N]
//       [--shards S] [--restore_shards S2] [--optimizer adam] [--dir DIR]
// Declares every gradient file `copies` times as a tensor on S in-process shards (lossless,
// one worker, chunk_bytes 1 MiB), pushes one step so every chunk holds its full optimizer
// state, writes the final checkpoint of every shard (sequentially: encode, write, fsync),
// restores it into S2 shards (each reads the whole set and keeps what it owns), and times
// `cp -r` of the set (without and with `sync`). Prints a table and one JSON line.
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "base/malloc_tuning.h"
#include "base/npy.h"
#include "cluster/cluster_config.h"
#include "cluster/wire_block.h"
#include "server/shard_service.h"

ABSL_FLAG(std::string, gradients, "",
          "Comma-separated .npy files; default: every .npy in $GCOMP_GRADIENTS_DIR.");
ABSL_FLAG(int, copies, 8, "Each file is declared this many times (keys g<i>_<copy>).");
ABSL_FLAG(int, shards, 2, "Shards that write the checkpoint.");
ABSL_FLAG(int, restore_shards, 3, "Shards that restore it.");
ABSL_FLAG(std::string, optimizer, "adam", "none|sgd|momentum|adam");
ABSL_FLAG(std::string, dir, "", "Checkpoint directory (default: a new folder under /tmp).");
ABSL_FLAG(std::string, child, "",
          "Internal: 'restore' restores shard 0 of --restore_shards from --dir and exits; "
          "'load_all' loads the whole newest set into memory (what a restore held before it "
          "streamed) and exits. The parent reads the child's peak RSS.");

namespace {

using gcomp::server::ShardService;

// This process's peak RSS (VmHWM: of its own address space, unlike getrusage's
// ru_maxrss, which keeps the forking parent's), in bytes.
uint64_t OwnPeakRss() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// Runs this program as `--child MODE` on `dir`; the child's peak RSS (bytes), 0 when it
// failed. The child prints it as its last line.
uint64_t ChildPeakRss(const std::string& mode, const std::string& dir, int shards) {
  const std::string cmd = absl::StrCat("/proc/", getpid(), "/exe --child=", mode, " --dir='", dir,
                                       "' --restore_shards=", shards);
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return 0;
  char buf[256];
  uint64_t rss = 0;
  while (fgets(buf, sizeof(buf), p) != nullptr) rss = std::strtoull(buf, nullptr, 10);
  return pclose(p) == 0 ? rss : 0;
}

uint64_t DirBytes(const std::string& dir) {
  uint64_t total = 0;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d)) {
    std::string p = dir + "/" + e->d_name;
    struct stat st;
    if (e->d_name[0] != '.' && stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode)) total += st.st_size;
  }
  closedir(d);
  return total;
}

double TimeShell(const std::string& cmd) {
  const absl::Time start = absl::Now();
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "command failed: %s\n", cmd.c_str());
    std::exit(1);
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

}  // namespace

int main(int argc, char** argv) {
  gcomp::TuneMallocForLargeBuffers();  // as gcomp_server does
  absl::ParseCommandLine(argc, argv);
  (void)gcomp::InitLogging("checkpoint_bench", "warn", "text");
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) {
    std::string tmpl = "/tmp/gcomp-ckpt-bench.XXXXXX";
    dir = mkdtemp(tmpl.data());
  }
  auto config_for = [&](int shards) {
    std::string list;
    for (int i = 0; i < shards; ++i) list += absl::StrCat(i ? "," : "", "127.0.0.1:", 1000 + i);
    return *gcomp::cluster::ParseClusterConfig(
        "job: bench\n", {"workers=1", "uplink.mode=lossless", "downlink.mode=lossless",
                         "optimizer.name=" + absl::GetFlag(FLAGS_optimizer),
                         "limits.memory_budget_bytes=0", "checkpoint.dir=" + dir, "shards=" + list});
  };
  const int S = absl::GetFlag(FLAGS_shards);
  const int S2 = absl::GetFlag(FLAGS_restore_shards);
  if (absl::GetFlag(FLAGS_child) == "restore") {
    auto s = ShardService::Create(config_for(S2), gcomp::server::ShardOptions{0, 4, {}});
    if (!s.ok()) std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
    std::printf("%llu\n", static_cast<unsigned long long>(OwnPeakRss()));
    return s.ok() ? 0 : 1;
  }
  if (absl::GetFlag(FLAGS_child) == "load_all") {
    auto c = gcomp::server::LoadLatestCheckpoint(gcomp::cluster::JobCheckpointDir(config_for(S2)));
    if (!c.ok()) std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
    std::printf("%llu\n", static_cast<unsigned long long>(OwnPeakRss()));
    return c.ok() ? 0 : 1;
  }
  std::vector<std::string> files = absl::StrSplit(absl::GetFlag(FLAGS_gradients), ',', absl::SkipEmpty());
  if (files.empty()) {
    const char* dir = std::getenv("GCOMP_GRADIENTS_DIR");
    if (dir == nullptr) dir = "/work/shared/data/gradients";
    DIR* d = opendir(dir);
    if (d == nullptr) {
      std::printf("checkpoint_bench: no gradients (set --gradients or GCOMP_GRADIENTS_DIR); skipped\n");
      return 0;
    }
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 4 && n.substr(n.size() - 4) == ".npy") files.push_back(absl::StrCat(dir, "/", n));
    }
    closedir(d);
    std::sort(files.begin(), files.end());
  }
  std::vector<std::vector<float>> grads;
  for (const std::string& f : files) {
    absl::StatusOr<gcomp::NpyArray> a = gcomp::ReadNpyF32(f);
    if (!a.ok()) {
      std::fprintf(stderr, "%s\n", a.status().ToString().c_str());
      return 1;
    }
    grads.push_back(std::move(a->data));
  }
  const gcomp::proto::ClusterConfig config = config_for(S);
  std::vector<std::unique_ptr<ShardService>> shards;
  for (int k = 0; k < S; ++k) {
    shards.push_back(*ShardService::Create(config, gcomp::server::ShardOptions{static_cast<uint32_t>(k), 4, {}}));
  }
  uint64_t elements = 0;
  const size_t chunk_elements = config.chunk_bytes() / 4;
  for (size_t g = 0; g < grads.size(); ++g) {
    for (int copy = 0; copy < absl::GetFlag(FLAGS_copies); ++copy) {
      const std::string key = absl::StrCat("g", g, "_", copy);
      const std::vector<float>& v = grads[g];
      elements += v.size();
      std::vector<ShardService*> owner((v.size() + chunk_elements - 1) / chunk_elements);
      for (auto& s : shards) {
        gcomp::proto::DeclareTensorRequest d;
        d.set_job("bench");
        d.set_key(key);
        d.set_dtype(gcomp::proto::DTYPE_F32);
        d.set_elements(v.size());
        d.set_shard_map_epoch(1);
        gcomp::proto::DeclareTensorResponse r;
        absl::Status st = s->DeclareTensor(d, &r);
        if (!st.ok()) {
          std::fprintf(stderr, "%s\n", st.ToString().c_str());
          return 1;
        }
        for (uint32_t c : r.owned_chunks()) owner[c] = s.get();
      }
      for (size_t c = 0; c < owner.size(); ++c) {
        const size_t n = std::min(chunk_elements, v.size() - c * chunk_elements);
        gcomp::proto::CompressedBlock b, out;
        (void)gcomp::cluster::EncodeWireBlock(gcomp::cluster::UplinkCodec(config), gcomp::codec::DType::kF32,
                                              v.data() + c * chunk_elements, n, &b);
        gcomp::proto::BlockAddress* a = b.mutable_address();
        a->set_job("bench");
        a->set_key(key);
        a->set_chunk(c);
        a->set_step(0);
        a->set_shard_map_epoch(1);
        absl::Status st = owner[c]->PushPull(b, absl::Now() + absl::Seconds(60), &out);
        if (!st.ok()) {
          std::fprintf(stderr, "%s\n", st.ToString().c_str());
          return 1;
        }
      }
    }
  }
  const uint64_t state_bytes =
      elements * gcomp::cluster::Optimizer::StateBytesPerElement(
                      *gcomp::cluster::ParseOptimizerKind(absl::GetFlag(FLAGS_optimizer)));
  absl::Time start = absl::Now();
  for (auto& s : shards) {
    s->Shutdown();
    absl::Status st = s->WriteFinalCheckpoint();
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
  }
  const double write_s = absl::ToDoubleSeconds(absl::Now() - start);
  shards.clear();
  const std::string set = absl::StrCat(gcomp::cluster::JobCheckpointDir(config_for(S)), "/final-of-", S);
  const uint64_t file_bytes = DirBytes(set);

  const gcomp::proto::ClusterConfig config2 = config_for(S2);
  start = absl::Now();
  std::vector<std::unique_ptr<ShardService>> restored;
  for (int k = 0; k < S2; ++k) {
    auto s = ShardService::Create(config2, gcomp::server::ShardOptions{static_cast<uint32_t>(k), 4, {}});
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.status().ToString().c_str());
      return 1;
    }
    restored.push_back(*std::move(s));
  }
  const double restore_s = absl::ToDoubleSeconds(absl::Now() - start);
  restored.clear();
  // One restoring shard in a process of its own, as a pod restores: its peak RSS, beside a
  // process that only loads the whole set as the restore did before it streamed.
  const uint64_t restore_rss = ChildPeakRss("restore", dir, S2);
  const uint64_t load_all_rss = ChildPeakRss("load_all", dir, S2);

  const std::string copy = dir + "/cp-copy";
  const double cp_s = TimeShell(absl::StrCat("cp -r '", set, "' '", copy, "'"));
  const double cp_sync_s = TimeShell(absl::StrCat("rm -rf '", copy, "' && cp -r '", set, "' '", copy,
                                                  "' && sync -f '", copy, "'"));
  TimeShell(absl::StrCat("rm -rf '", copy, "'"));

  const double gb = 1e9;
  std::printf("%-44s %10s %10s\n", "what", "seconds", "GB/s");
  std::printf("%-44s %10.3f %10.3f\n", absl::StrCat("write, ", S, " shards (state bytes)").c_str(), write_s,
              state_bytes / gb / write_s);
  std::printf("%-44s %10.3f %10.3f\n", "write (file bytes)", write_s, file_bytes / gb / write_s);
  std::printf("%-44s %10.3f %10.3f\n", absl::StrCat("restore into ", S2, " shards (file bytes)").c_str(),
              restore_s, file_bytes / gb / restore_s);
  std::printf("%-44s %10.3f %10.3f\n", "cp -r of the same files", cp_s, file_bytes / gb / cp_s);
  std::printf("peak RSS of one shard restoring (1 of %d): %.1f MB; of a process loading the whole "
              "set: %.1f MB (set files %.1f MB)\n",
              S2, restore_rss / 1e6, load_all_rss / 1e6, file_bytes / 1e6);
  std::printf("%-44s %10.3f %10.3f\n", "cp -r + sync of the same files", cp_sync_s, file_bytes / gb / cp_sync_s);
  std::printf(
      "{\"tensors\": %zu, \"elements\": %llu, \"optimizer\": \"%s\", \"shards\": %d, \"restore_shards\": %d, "
      "\"state_bytes\": %llu, \"file_bytes\": %llu, \"write_s\": %.4f, \"restore_s\": %.4f, \"cp_s\": %.4f, "
      "\"cp_sync_s\": %.4f, \"restore_one_peak_rss_bytes\": %llu, \"load_all_peak_rss_bytes\": %llu}\n",
      grads.size() * absl::GetFlag(FLAGS_copies), static_cast<unsigned long long>(elements),
      absl::GetFlag(FLAGS_optimizer).c_str(), S, S2, static_cast<unsigned long long>(state_bytes),
      static_cast<unsigned long long>(file_bytes), write_s, restore_s, cp_s, cp_sync_s,
      static_cast<unsigned long long>(restore_rss), static_cast<unsigned long long>(load_all_rss));
  return 0;
}
