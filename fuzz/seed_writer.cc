// Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/): real encoded blocks
// and frames, wire blocks, cluster configs and shard sessions, a few hundred elements each.
//   bazel run //fuzz:seed_writer -- $PWD/fuzz/corpus
// Deterministic: the same code writes the same files.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/cluster_config.h"
#include "cluster/shard_map.h"
#include "cluster/wire_block.h"
#include "codec/codec.h"
#include "fuzz/fuzz_session.pb.h"
#include "fuzz/fuzz_support.h"
#include "server/checkpoint.h"
#include "server/chunk_state.h"

namespace gcomp::fuzz {
namespace {

std::string g_root;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::filesystem::path dir = std::filesystem::path(g_root) / target;
  std::filesystem::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  Check(static_cast<bool>(out), absl::StrCat("writing ", (dir / name).string()));
}

// Float patterns the codec treats differently (zero maps, table kinds, special values).
enum class Pattern { kGradient, kSparse, kVerySparse, kZeros, kSpecial, kNoise };
const char* PatternName(Pattern p) {
  static const char* const kNames[] = {"gradient", "sparse", "verysparse",
                                       "zeros",    "special", "noise"};
  return kNames[static_cast<int>(p)];
}

std::vector<float> Values(Pattern pattern, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    switch (pattern) {
      case Pattern::kGradient:
        v[i] = normal(rng);
        break;
      case Pattern::kSparse:
        v[i] = (rng() % 4 == 0) ? normal(rng) : 0.0f;
        break;
      case Pattern::kVerySparse:
        v[i] = (rng() % 50 == 0) ? normal(rng) : 0.0f;
        break;
      case Pattern::kZeros:
        v[i] = 0.0f;
        break;
      case Pattern::kSpecial: {
        static const float kSpecials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f,
                                          -1e-45f, 3.4e38f, 1.0f, -2.5f};
        v[i] = (i % 3 == 0) ? kSpecials[(i / 3) % 10] : normal(rng);
        break;
      }
      case Pattern::kNoise: {
        const uint32_t bits = static_cast<uint32_t>(rng());
        std::memcpy(&v[i], &bits, 4);
        break;
      }
    }
  }
  return v;
}

// n elements of `dtype` holding `values` (narrowed for 16-bit types).
std::string AsDType(codec::DType dtype, const std::vector<float>& values) {
  std::string bytes(values.size() * codec::DTypeBytes(dtype), '\0');
  codec::FromF32(dtype, values.data(), values.size(), bytes.data());
  return bytes;
}

void WriteBlocks() {
  const codec::DType dtypes[] = {codec::DType::kF32, codec::DType::kBF16, codec::DType::kF16};
  const Pattern patterns[] = {Pattern::kGradient, Pattern::kSparse, Pattern::kVerySparse,
                              Pattern::kZeros,    Pattern::kSpecial, Pattern::kNoise};
  uint32_t seed = 1;
  for (codec::DType dtype : dtypes) {
    for (Pattern pattern : patterns) {
      for (size_t n : {size_t{1}, size_t{37}, size_t{300}}) {
        for (codec::Mode mode : {codec::Mode::kLossless, codec::Mode::kNearLossless}) {
          codec::Policy policy;
          policy.mode = mode;
          if (seed % 3 == 0) policy.rel_bits = 3, policy.abs_log2 = -8;
          const std::string data = AsDType(dtype, Values(pattern, n, seed++));
          std::string block;
          Check(codec::EncodeBlock(dtype, data.data(), n, policy, &block).ok(), "EncodeBlock");
          Write("codec_block",
                absl::StrCat(codec::DTypeName(dtype), "_", PatternName(pattern), "_", n, "_",
                             codec::ModeName(mode)),
                block);
        }
      }
    }
  }
  // Blocks naming the shared table instead of carrying their own.
  for (size_t n : {size_t{64}, size_t{400}}) {
    // Magnitudes in the range the shared table was built from (fuzz_support.cc).
    std::vector<float> values(n);
    for (size_t i = 0; i < n; ++i) {
      const float v = std::ldexp(1.0f + 0.003f * static_cast<float>(i % 31),
                                 -12 - static_cast<int>(i % 7));
      values[i] = (i % 5 == 0) ? -v : v;
    }
    codec::BlockEncodeOptions options;
    options.shared_table = &SharedTable();
    std::string block;
    Check(codec::EncodeBlock(codec::DType::kF32, values.data(), n, options, &block).ok(),
          "EncodeBlock with the shared table");
    Write("codec_block", absl::StrCat("f32_shared_table_", n), block);
  }
}

void WriteFrames() {
  const codec::DType dtypes[] = {codec::DType::kF32, codec::DType::kBF16, codec::DType::kF16};
  uint32_t seed = 100;
  for (codec::DType dtype : dtypes) {
    for (Pattern pattern : {Pattern::kGradient, Pattern::kSparse, Pattern::kSpecial}) {
      for (size_t n : {size_t{1}, size_t{300}, size_t{1000}}) {
        codec::BufferOptions options;
        options.block_bytes = 256;  // several blocks per frame
        options.policy.mode = seed % 2 ? codec::Mode::kLossless : codec::Mode::kNearLossless;
        const std::string data = AsDType(dtype, Values(pattern, n, seed++));
        std::string frame;
        Check(codec::EncodeBuffer(dtype, data.data(), n, options, &frame).ok(), "EncodeBuffer");
        Write("codec_frame",
              absl::StrCat(codec::DTypeName(dtype), "_", PatternName(pattern), "_", n), frame);
      }
    }
  }
}

proto::CompressedBlock WireBlock(const cluster::DirectionCodec& dc, codec::DType dtype,
                                 const std::vector<float>& values) {
  const std::string data = AsDType(dtype, values);
  proto::CompressedBlock block;
  Check(cluster::EncodeWireBlock(dc, dtype, data.data(), values.size(), &block).ok(),
        "EncodeWireBlock");
  return block;
}

void WriteWireBlocks() {
  uint32_t seed = 200;
  for (codec::DType dtype : {codec::DType::kF32, codec::DType::kBF16, codec::DType::kF16}) {
    for (int mode = 0; mode < 3; ++mode) {
      cluster::DirectionCodec dc;
      dc.raw = mode == 0;
      dc.policy.mode = mode == 1 ? codec::Mode::kLossless : codec::Mode::kNearLossless;
      for (size_t n : {size_t{5}, size_t{256}}) {
        proto::CompressedBlock block =
            WireBlock(dc, dtype, Values(seed % 2 ? Pattern::kGradient : Pattern::kSparse, n, seed));
        ++seed;
        proto::BlockAddress* a = block.mutable_address();
        a->set_job("train");
        a->set_key("layer1.weight");
        a->set_chunk(3);
        a->set_step(7);
        a->set_worker(1);
        a->set_shard_map_epoch(1);
        // The same blocks seed the reader of received PushPull messages.
        for (const char* target : {"wire_block", "wire_message"}) {
          Write(target,
                absl::StrCat(codec::DTypeName(dtype), "_", mode == 0 ? "raw" : "gcomp", "_",
                             codec::ModeName(dc.policy.mode), "_", n),
                block.SerializeAsString());
        }
      }
    }
  }
}

void WriteConfigs() {
  Write("cluster_config", "docs_example.yaml",
        "job: train\nworkers: 4\nshards: [\"10.0.0.1:7000\", \"10.0.0.2:7000\"]\n"
        "chunk_bytes: 1048576\nuplink: {mode: near-lossless, rel_bits: 7, abs_log2: -16}\n"
        "downlink: {mode: near-lossless}\noptimizer: {name: none}\n"
        "step_timeout_ms: 10000\nrpc_timeout_ms: 30000\n");
  Write("cluster_config", "minimal.yaml", "shards: [localhost:7000]\n");
  Write("cluster_config", "json.json",
        "{\"job\": \"j\", \"workers\": 2, \"shards\": [\"a:1\", \"b:2\", \"c:3\"], "
        "\"optimizer\": {\"name\": \"adam\", \"learning_rate\": 0.001, \"beta1\": 0.9, "
        "\"beta2\": 0.999, \"epsilon\": 1e-8}}\n");
  Write("cluster_config", "block_style.yaml",
        "job: demo\nworkers: 8\nshards:\n  - 127.0.0.1:7000\n  - 127.0.0.1:7001\n"
        "shard_map_epoch: 3\nuplink:\n  mode: lossless\ndownlink:\n  mode: none\n"
        "optimizer:\n  name: momentum\n  learning_rate: 0.1\n  momentum: 0.9\n"
        "channels_per_shard: 4\nmax_inflight_chunks: 16\nmax_retries: 2\n"
        "retry_backoff_ms: 10\nmax_message_bytes: 4194304\nconnect_timeout_ms: 100\n");
  Write("cluster_config", "limits_security.yaml",
        "shards: [\"s:1\"]\nlimits: {memory_budget_bytes: 67108864, max_tensors: 100, "
        "max_key_bytes: 256, max_pending_steps: 10, max_pending_bytes: 1048576, "
        "max_calls_per_client: 8}\nsecurity: {token_file: /tmp/token, health_port: 8080, "
        "cert_refresh_s: 60}\n");
  // Text, a NUL byte, then overrides one per line.
  Write("cluster_config", "with_overrides",
        std::string("workers: 2\n", 11) + std::string(1, '\0') +
            "shards=a:1,b:2\nuplink.mode=none\noptimizer.name=sgd\nchunk_bytes=4096\n");
  Write("cluster_config", "roundtrip.yaml",
        cluster::ClusterConfigToYaml(*cluster::ParseClusterConfig("shards: [x:1, y:2]\n")));
  Write("cluster_config", "bad_field.yaml", "shards: [a:1]\nuplink: {rel_bits: 40}\n");
}

// Sessions against a shard with chunk_bytes 1024 (see shard_service_fuzz.cc).
void AddRegister(FuzzSession* s, uint32_t worker) {
  proto::RegisterWorkerRequest* r = s->add_calls()->mutable_register_worker();
  r->set_job("fuzz");
  r->set_worker(worker);
  r->set_name(absl::StrCat("w", worker));
  r->set_shard_map_epoch(1);
}

void AddDeclare(FuzzSession* s, const std::string& key, proto::DType dtype, uint64_t elements,
                bool initial, const std::string& optimizer) {
  proto::DeclareTensorRequest* d = s->add_calls()->mutable_declare_tensor();
  d->set_job("fuzz");
  d->set_key(key);
  d->set_dtype(dtype);
  d->set_elements(elements);
  d->set_shard_map_epoch(1);
  if (!optimizer.empty()) {
    d->mutable_optimizer()->set_name(optimizer);
    d->mutable_optimizer()->set_learning_rate(0.1);
    d->mutable_optimizer()->set_momentum(0.5);
    d->mutable_optimizer()->set_beta1(0.9);
    d->mutable_optimizer()->set_beta2(0.99);
    d->mutable_optimizer()->set_epsilon(1e-6);
  }
  if (initial) {
    const codec::DType dt = *cluster::FromProto(dtype);
    const cluster::ChunkLayout layout(elements, codec::DTypeBytes(dt), 1024);
    proto::ChunkValue* v = d->add_initial();
    v->set_chunk(0);
    v->set_data(AsDType(dt, Values(Pattern::kGradient, layout.size(0), 7)));
  }
}

void AddPush(FuzzSession* s, const std::string& key, proto::DType dtype, uint64_t elements,
             uint32_t chunk, int64_t step, uint32_t worker, int mode, uint32_t seed) {
  const codec::DType dt = *cluster::FromProto(dtype);
  const cluster::ChunkLayout layout(elements, codec::DTypeBytes(dt), 1024);
  cluster::DirectionCodec dc;
  dc.raw = mode == 0;
  dc.policy.mode = mode == 1 ? codec::Mode::kLossless : codec::Mode::kNearLossless;
  proto::CompressedBlock* b = s->add_calls()->mutable_push_pull();
  *b = WireBlock(dc, dt, Values(Pattern::kGradient, layout.size(chunk), seed));
  proto::BlockAddress* a = b->mutable_address();
  a->set_job("fuzz");
  a->set_key(key);
  a->set_chunk(chunk);
  a->set_step(step);
  a->set_worker(worker);
  a->set_shard_map_epoch(1);
}

void AddPull(FuzzSession* s, const std::string& key, uint32_t chunk) {
  proto::PullRequest* p = s->add_calls()->mutable_pull();
  p->set_job("fuzz");
  p->set_key(key);
  p->set_chunk(chunk);
  p->set_shard_map_epoch(1);
}

void WriteSessions() {
  {
    FuzzSession s;  // one worker, f32, near-lossless pushes over two steps
    AddRegister(&s, 0);
    AddDeclare(&s, "w", proto::DTYPE_F32, 600, true, "");
    for (int64_t step = 0; step < 2; ++step) {
      for (uint32_t c = 0; c < 3; ++c) AddPush(&s, "w", proto::DTYPE_F32, 600, c, step, 0, 2, c);
    }
    AddPull(&s, "w", 1);
    s.add_calls()->mutable_stats();
    Write("shard_service", "one_worker_f32", s.SerializeAsString());
  }
  {
    FuzzSession s;  // two workers, bf16, lossless, momentum, a duplicate and a stale push
    s.set_workers(1);
    s.set_downlink(1);
    AddRegister(&s, 0);
    AddRegister(&s, 1);
    AddDeclare(&s, "b", proto::DTYPE_BF16, 700, true, "momentum");
    AddPush(&s, "b", proto::DTYPE_BF16, 700, 0, 0, 0, 1, 1);
    AddPush(&s, "b", proto::DTYPE_BF16, 700, 0, 0, 1, 1, 2);
    AddPush(&s, "b", proto::DTYPE_BF16, 700, 0, 0, 1, 1, 2);
    AddPush(&s, "b", proto::DTYPE_BF16, 700, 0, 1, 0, 1, 3);
    AddPull(&s, "b", 0);
    s.add_calls()->mutable_stats();
    Write("shard_service", "two_workers_bf16", s.SerializeAsString());
  }
  {
    FuzzSession s;  // raw pushes, f16, adam, downlink none, two shards
    s.set_shards(1);
    s.set_downlink(0);
    AddDeclare(&s, "h", proto::DTYPE_F16, 2000, false, "adam");
    for (uint32_t c = 0; c < 4; ++c) AddPush(&s, "h", proto::DTYPE_F16, 2000, c, 0, 0, 0, c);
    for (uint32_t c = 0; c < 4; ++c) AddPull(&s, "h", c);
    s.add_calls()->mutable_stats();
    Write("shard_service", "two_shards_f16_raw", s.SerializeAsString());
  }
  {
    FuzzSession s;  // redeclaration conflicts, unknown job/key, bad epoch
    AddDeclare(&s, "x", proto::DTYPE_F32, 10, false, "sgd");
    AddDeclare(&s, "x", proto::DTYPE_F32, 11, false, "sgd");
    AddDeclare(&s, "x", proto::DTYPE_F32, 10, false, "");
    AddPull(&s, "y", 0);
    AddPull(&s, "x", 5);
    AddPush(&s, "x", proto::DTYPE_F32, 10, 0, -1, 0, 2, 9);
    AddPush(&s, "x", proto::DTYPE_F32, 10, 0, 0, 0, 2, 9);
    s.mutable_calls(s.calls_size() - 1)->mutable_push_pull()->mutable_address()->set_shard_map_epoch(2);
    AddPush(&s, "x", proto::DTYPE_F32, 10, 0, 0, 0, 2, 9);
    Write("shard_service", "errors", s.SerializeAsString());
  }
  {
    FuzzSession s;  // a live re-shard 1 -> 2 shards after a step, then pushes on both maps
    AddRegister(&s, 0);
    AddDeclare(&s, "r", proto::DTYPE_F32, 900, true, "momentum");
    for (uint32_t c = 0; c < 4; ++c) AddPush(&s, "r", proto::DTYPE_F32, 900, c, 0, 0, 1, c);
    proto::PrepareReshardRequest* p = s.add_calls()->mutable_prepare();
    p->mutable_next()->add_shards("127.0.0.1:7000");  // no job: the session's config
    p->mutable_next()->add_shards("127.0.0.1:7001");
    p->mutable_next()->set_shard_map_epoch(2);
    p->set_at_step(2);
    p->set_old_shards(1);
    AddPush(&s, "r", proto::DTYPE_F32, 900, 0, 1, 0, 1, 5);
    proto::CommitReshardRequest* c = s.add_calls()->mutable_commit();
    c->set_next_epoch(2);
    c->set_switch_step(2);
    AddPush(&s, "r", proto::DTYPE_F32, 900, 1, 1, 0, 1, 6);
    AddPush(&s, "r", proto::DTYPE_F32, 900, 0, 2, 0, 1, 7);
    proto::TransferRequest* t = s.add_calls()->mutable_transfer();
    t->set_job("fuzz");
    t->set_next_epoch(2);
    t->set_from_shard(0);
    t->set_last(true);
    s.add_calls()->mutable_reshard_status();
    proto::AbortReshardRequest* a = s.add_calls()->mutable_abort();
    a->set_next_epoch(2);
    AddPull(&s, "r", 0);
    Write("shard_service", "reshard", s.SerializeAsString());
  }
  {
    FuzzSession s;  // two shards, replicas 2: a state replicated in, a failover, a rejoin
    s.set_shards(1);
    s.set_replicas(1);
    AddRegister(&s, 0);
    AddDeclare(&s, "f", proto::DTYPE_F32, 900, true, "adam");
    for (uint32_t c = 0; c < 4; ++c) AddPush(&s, "f", proto::DTYPE_F32, 900, c, 0, 0, 1, c);
    proto::ReplicateRequest* r = s.add_calls()->mutable_replicate();
    r->set_job("fuzz");
    r->set_shard_map_epoch(1);
    r->set_from_shard(1);
    r->mutable_part()->set_key("f");
    r->mutable_part()->set_chunk(1);
    r->mutable_part()->set_elements(256);
    r->set_completes_chunk(true);
    proto::ReportDownRequest* d = s.add_calls()->mutable_report_down();
    d->set_job("fuzz");
    d->set_shard_map_epoch(1);
    d->set_shard(1);
    proto::InstallMapRequest* m = s.add_calls()->mutable_install_map();
    m->mutable_map()->set_shard_map_epoch(2);  // no job: the session's config
    m->mutable_map()->add_down_shards(1);
    for (uint32_t c = 0; c < 4; ++c) AddPush(&s, "f", proto::DTYPE_F32, 900, c, 1, 0, 1, c + 4);
    s.mutable_calls(s.calls_size() - 1)->mutable_push_pull()->mutable_address()->set_shard_map_epoch(2);
    proto::RejoinRequest* j = s.add_calls()->mutable_rejoin();
    j->set_job("fuzz");
    j->set_shard(1);
    s.add_calls()->mutable_reshard_status();
    Write("shard_service", "failover", s.SerializeAsString());
  }
}

}  // namespace
}  // namespace gcomp::fuzz

namespace gcomp::fuzz {

// Checkpoint data files: declarations and chunk states of each optimizer's shape.
void WriteCheckpoints() {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.01f);
  for (const char* optimizer : {"none", "momentum", "adam"}) {
    std::vector<proto::CheckpointRecord> records;
    proto::TensorDeclaration* d = records.emplace_back().mutable_declaration();
    d->set_job("j");
    d->set_key("w");
    d->set_dtype(proto::DTYPE_F32);
    d->set_elements(300);
    d->set_chunk_bytes(512);
    d->mutable_optimizer()->set_name(optimizer);
    for (uint32_t chunk : {0u, 2u}) {
      const size_t n = chunk == 2 ? 44 : 128;
      server::ChunkSnapshot snap;
      snap.started = true;
      snap.current_step = 4;
      snap.completed_step = 3;
      snap.optimizer.steps = 4;
      for (std::vector<float>* v : {&snap.optimizer.value, &snap.optimizer.m, &snap.optimizer.v}) {
        if (v != &snap.optimizer.value && std::string(optimizer) == "none") continue;
        if (v == &snap.optimizer.v && std::string(optimizer) != "adam") continue;
        v->resize(n);
        for (float& x : *v) x = normal(rng);
      }
      auto result = std::make_shared<proto::CompressedBlock>();
      cluster::DirectionCodec lossless;
      lossless.policy.mode = codec::Mode::kLossless;
      cluster::EncodeWireBlock(lossless, codec::DType::kF32, snap.optimizer.value.data(), n,
                               result.get())
          .IgnoreError();
      result->mutable_address()->set_key("w");
      result->mutable_address()->set_chunk(chunk);
      result->mutable_address()->set_step(3);
      snap.cached_result = result;
      server::ChunkStateToProto("j", "w", chunk, n, snap, records.emplace_back().mutable_chunk())
          .IgnoreError();
    }
    Write("checkpoint_file", absl::StrCat("shard_", optimizer), server::SerializeCheckpointFile(records));
  }
  Write("checkpoint_file", "empty", server::SerializeCheckpointFile({}));
}

}  // namespace gcomp::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_ROOT (e.g. $PWD/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  gcomp::fuzz::g_root = argv[1];
  gcomp::fuzz::WriteBlocks();
  gcomp::fuzz::WriteFrames();
  gcomp::fuzz::WriteWireBlocks();
  gcomp::fuzz::WriteConfigs();
  gcomp::fuzz::WriteSessions();
  gcomp::fuzz::WriteCheckpoints();
  std::printf("seed corpora written under %s\n", argv[1]);
  return 0;
}
