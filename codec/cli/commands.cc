#include "codec/cli/commands.h"

#include <lz4.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/npy.h"
#include "base/thread_pool.h"
#include "codec/cli/gcz.h"

namespace gcomp::cli {
namespace {

using codec::DType;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Never leaves `path` half-written: write a temporary file beside it, then rename.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes) {
  const std::string tmp = absl::StrCat(path, ".tmp", getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot create ", tmp));
    out.write(bytes.data(), bytes.size());
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::DataLossError(absl::StrCat("cannot write ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::PermissionDeniedError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

absl::Status Annotate(const absl::Status& st, const std::string& path) {
  return absl::Status(st.code(), absl::StrCat(path, ": ", st.message()));
}

}  // namespace

absl::Status Compress(const std::string& in_path, const std::string& out_path,
                      const CompressOptions& options) {
  absl::StatusOr<NpyArray> array = ReadNpyF32(in_path);
  if (!array.ok()) return array.status();
  const size_t n = array->data.size();
  std::vector<uint8_t> values(n * codec::DTypeBytes(options.dtype));
  codec::FromF32(options.dtype, array->data.data(), n, values.data());
  GczHeader header;
  header.dtype = options.dtype;
  header.shape.assign(array->shape.begin(), array->shape.end());
  std::string out;
  AppendGczHeader(header, &out);
  codec::BufferOptions buffer;
  buffer.policy = options.policy;
  buffer.threads = options.threads;
  if (absl::Status st = codec::EncodeBuffer(options.dtype, values.data(), n, buffer, &out);
      !st.ok()) {
    return st;
  }
  return WriteFileAtomically(out_path, out);
}

absl::Status Decompress(const std::string& in_path, const std::string& out_path, int threads) {
  absl::StatusOr<std::string> file = ReadFile(in_path);
  if (!file.ok()) return file.status();
  absl::string_view frame;
  absl::StatusOr<GczHeader> header = ParseGcz(*file, &frame);
  if (!header.ok()) return Annotate(header.status(), in_path);
  absl::StatusOr<codec::FrameInfo> info = codec::InspectFrame(codec::AsBytes(frame));
  if (!info.ok()) return Annotate(info.status(), in_path);
  uint64_t count = 1;
  for (uint64_t d : header->shape) count *= d;
  if (count != info->elements || info->dtype != header->dtype) {
    return absl::DataLossError(
        absl::StrCat(in_path, ": header shape/dtype does not match the frame"));
  }
  std::vector<uint8_t> values(count * codec::DTypeBytes(header->dtype));
  if (absl::Status st =
          codec::DecodeBuffer(codec::AsBytes(frame), header->dtype, values.data(), count, threads);
      !st.ok()) {
    return Annotate(st, in_path);
  }
  std::vector<float> f32(count);
  codec::ToF32(header->dtype, values.data(), count, f32.data());
  std::vector<size_t> shape(header->shape.begin(), header->shape.end());
  return WriteFileAtomically(out_path, SerializeNpyF32(f32, shape));
}

absl::Status Inspect(const std::string& in_path, std::ostream& out) {
  absl::StatusOr<std::string> file = ReadFile(in_path);
  if (!file.ok()) return file.status();
  absl::string_view frame;
  absl::StatusOr<GczHeader> header = ParseGcz(*file, &frame);
  if (!header.ok()) return Annotate(header.status(), in_path);
  absl::StatusOr<codec::FrameInfo> info = codec::InspectFrame(codec::AsBytes(frame));
  if (!info.ok()) return Annotate(info.status(), in_path);
  uint64_t nonzeros = 0, header_bytes = 0, mantissa = 0, zero_map = 0, table = 0, exponent = 0,
           stored = 0;
  std::string policy = "{}";
  for (absl::Span<const uint8_t> block : info->blocks) {
    absl::StatusOr<codec::BlockInfo> b = codec::InspectBlock(block);
    if (!b.ok()) return Annotate(b.status(), in_path);
    nonzeros += b->nonzeros;
    header_bytes += b->header_bytes;
    mantissa += b->mantissa_bytes;
    zero_map += b->zero_map_bytes;
    table += b->table_bytes;
    exponent += b->exponent_bytes;
    if (b->table == codec::TableKind::kStored) stored += 1;
    policy = absl::StrFormat(R"({"mode": "%s", "rel_bits": %d, "abs_log2": %d})",
                             codec::ModeName(b->policy.mode), b->policy.rel_bits,
                             b->policy.abs_log2);
  }
  const uint64_t n = info->elements;
  const uint64_t frame_overhead = frame.size() - header_bytes - mantissa - zero_map - table -
                                  exponent;
  const double per = n > 0 ? 8.0 / n : 0.0;
  auto section = [&](const char* name, uint64_t bytes) {
    return absl::StrFormat(R"("%s": {"bytes": %d, "bits_per_element": %.4f})", name, bytes,
                           bytes * per);
  };
  out << "{\n";
  out << absl::StrFormat(R"(  "file": "%s",)", in_path) << "\n";
  out << absl::StrFormat(R"(  "dtype": "%s",)", codec::DTypeName(info->dtype)) << "\n";
  out << "  \"shape\": [";
  for (size_t i = 0; i < header->shape.size(); ++i) out << (i ? ", " : "") << header->shape[i];
  out << "],\n";
  out << absl::StrFormat(R"(  "elements": %d,)", n) << "\n";
  out << absl::StrFormat(R"(  "zeros": %d,)", n - nonzeros) << "\n";
  out << absl::StrFormat(R"(  "blocks": %d,)", info->blocks.size()) << "\n";
  out << absl::StrFormat(R"(  "stored_blocks": %d,)", stored) << "\n";
  out << "  \"policy\": " << policy << ",\n";
  out << absl::StrFormat(R"(  "bytes": %d,)", file->size()) << "\n";
  out << absl::StrFormat(R"(  "ratio": %.4f,)",
                         file->size() ? n * codec::DTypeBytes(info->dtype) * 1.0 / file->size()
                                      : 0.0)
      << "\n";
  out << "  \"sections\": {\n";
  out << "    " << section("file_and_frame_headers", frame_overhead + (file->size() - frame.size()))
      << ",\n";
  out << "    " << section("block_headers", header_bytes) << ",\n";
  out << "    " << section("zero_map", zero_map) << ",\n";
  out << "    " << section("code_tables", table) << ",\n";
  out << "    " << section("exponents", exponent) << ",\n";
  out << "    " << section("sign_mantissa", mantissa) << "\n";
  out << "  }\n}\n";
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// bench

namespace {

using Clock = std::chrono::steady_clock;

double BestSeconds(int repeats, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// A byte compressor run chunk by chunk (the same chunking as the codec's blocks).
struct Baseline {
  std::string name;
  std::function<size_t(const char* src, size_t n, char* dst, size_t cap)> compress;
  std::function<size_t(const char* src, size_t n, char* dst, size_t cap)> decompress;
  std::function<size_t(size_t n)> bound;
};

std::vector<Baseline> Baselines() {
  auto zstd = [](int level) {
    Baseline b;
    b.name = absl::StrCat("zstd -", level);
    b.compress = [level](const char* src, size_t n, char* dst, size_t cap) {
      thread_local std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> ctx(ZSTD_createCCtx(),
                                                                          ZSTD_freeCCtx);
      return ZSTD_compressCCtx(ctx.get(), dst, cap, src, n, level);
    };
    b.decompress = [](const char* src, size_t n, char* dst, size_t cap) {
      thread_local std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> ctx(ZSTD_createDCtx(),
                                                                          ZSTD_freeDCtx);
      return ZSTD_decompressDCtx(ctx.get(), dst, cap, src, n);
    };
    b.bound = [](size_t n) { return ZSTD_compressBound(n); };
    return b;
  };
  Baseline lz4;
  lz4.name = "lz4";
  lz4.compress = [](const char* src, size_t n, char* dst, size_t cap) {
    return static_cast<size_t>(LZ4_compress_default(src, dst, static_cast<int>(n),
                                                    static_cast<int>(cap)));
  };
  lz4.decompress = [](const char* src, size_t n, char* dst, size_t cap) {
    return static_cast<size_t>(
        LZ4_decompress_safe(src, dst, static_cast<int>(n), static_cast<int>(cap)));
  };
  lz4.bound = [](size_t n) { return static_cast<size_t>(LZ4_compressBound(static_cast<int>(n))); };
  return {zstd(1), zstd(3), lz4};
}

struct Row {
  std::string name;
  double ratio = 0;
  double enc1 = 0, dec1 = 0, encn = 0, decn = 0;  // GB/s of uncompressed data
};

// Exponent entropy of nonzero elements plus the zero map the codec actually writes.
double LosslessBound(const std::vector<float>& data, const std::string& lossless_frame) {
  uint64_t hist[256] = {};
  uint64_t nnz = 0;
  for (float f : data) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (u == 0) continue;
    ++nnz;
    ++hist[(u >> 23) & 255];
  }
  double h = 0;
  for (uint64_t c : hist) {
    if (c) h -= c * std::log2(static_cast<double>(c) / nnz);
  }
  uint64_t zero_map_bytes = 0;
  absl::StatusOr<codec::FrameInfo> info = codec::InspectFrame(codec::AsBytes(lossless_frame));
  if (info.ok()) {
    for (auto block : info->blocks) {
      absl::StatusOr<codec::BlockInfo> b = codec::InspectBlock(block);
      if (b.ok()) zero_map_bytes += b->zero_map_bytes;
    }
  }
  const double bits = nnz * 24.0 + h + zero_map_bytes * 8.0;
  return bits > 0 ? data.size() * 32.0 / bits : 0.0;
}

}  // namespace

absl::Status Bench(const std::vector<std::string>& paths, const BenchOptions& options,
                   std::ostream& out) {
  if (paths.empty()) return absl::InvalidArgumentError("bench needs at least one .npy file");
  const int threads = std::max(1, options.threads);
  ThreadPool pool(threads - 1);
  out << absl::StrFormat("threads: 1 and %d; timings: best of %d runs; block: %d bytes\n",
                         threads, options.repeats, options.block_bytes);
  for (const std::string& path : paths) {
    absl::StatusOr<NpyArray> array = ReadNpyF32(path);
    if (!array.ok()) return array.status();
    const std::vector<float>& data = array->data;
    const size_t n = data.size(), bytes = n * 4;
    std::vector<Row> rows;
    std::string lossless_frame;

    for (codec::Mode mode : {codec::Mode::kLossless, codec::Mode::kNearLossless}) {
      Row row;
      row.name = absl::StrCat("gcomp ", codec::ModeName(mode));
      codec::BufferOptions bo;
      bo.policy.mode = mode;
      bo.block_bytes = options.block_bytes;
      std::string frame;
      std::vector<float> dec(n);
      for (int t : {1, threads}) {
        bo.pool = t == 1 ? nullptr : &pool;
        bo.threads = 1;
        absl::Status st;
        const double enc = BestSeconds(options.repeats, [&] {
          frame.clear();
          st.Update(codec::EncodeBuffer(DType::kF32, data.data(), n, bo, &frame));
        });
        codec::BufferDecodeOptions dopt;
        dopt.pool = bo.pool;
        const double dect = BestSeconds(options.repeats, [&] {
          st.Update(codec::DecodeBuffer(codec::AsBytes(frame), DType::kF32, dec.data(), n, dopt));
        });
        if (!st.ok()) return st;
        (t == 1 ? row.enc1 : row.encn) = bytes / enc / 1e9;
        (t == 1 ? row.dec1 : row.decn) = bytes / dect / 1e9;
      }
      row.ratio = static_cast<double>(bytes) / frame.size();
      if (mode == codec::Mode::kLossless) {
        if (std::memcmp(dec.data(), data.data(), bytes) != 0) {
          return absl::InternalError(absl::StrCat(path, ": lossless round trip differs"));
        }
        lossless_frame = frame;
      }
      rows.push_back(row);
    }

    const size_t chunk = options.block_bytes;
    const size_t chunks = (bytes + chunk - 1) / chunk;
    for (const Baseline& b : Baselines()) {
      Row row;
      row.name = b.name;
      const size_t cap = b.bound(chunk);
      std::vector<char> comp(chunks * cap);
      std::vector<size_t> sizes(chunks);
      std::vector<char> dec(bytes);
      const char* src = reinterpret_cast<const char*>(data.data());
      for (int t : {1, threads}) {
        ThreadPool* p = t == 1 ? nullptr : &pool;
        auto run = [&](const std::function<void(size_t)>& fn) {
          if (p) {
            p->ParallelFor(chunks, fn);
          } else {
            for (size_t i = 0; i < chunks; ++i) fn(i);
          }
        };
        const double enc = BestSeconds(options.repeats, [&] {
          run([&](size_t i) {
            const size_t len = std::min(chunk, bytes - i * chunk);
            sizes[i] = b.compress(src + i * chunk, len, comp.data() + i * cap, cap);
          });
        });
        const double dect = BestSeconds(options.repeats, [&] {
          run([&](size_t i) {
            const size_t len = std::min(chunk, bytes - i * chunk);
            b.decompress(comp.data() + i * cap, sizes[i], dec.data() + i * chunk, len);
          });
        });
        (t == 1 ? row.enc1 : row.encn) = bytes / enc / 1e9;
        (t == 1 ? row.dec1 : row.decn) = bytes / dect / 1e9;
      }
      if (std::memcmp(dec.data(), src, bytes) != 0) {
        return absl::InternalError(absl::StrCat(path, ": ", b.name, " round trip differs"));
      }
      size_t total = 0;
      for (size_t s : sizes) total += s;
      row.ratio = static_cast<double>(bytes) / total;
      rows.push_back(row);
    }

    const Row& zstd1 = rows[2];
    out << absl::StrFormat("\n%s (%d elements, %.1f MB)\n", path, n, bytes / 1e6);
    out << absl::StrFormat("lossless bound (exponent entropy + zero map): %.3fx; "
                           "gcomp lossless reaches %.1f%% of it\n",
                           LosslessBound(data, lossless_frame),
                           100.0 * rows[0].ratio / LosslessBound(data, lossless_frame));
    out << "| codec | ratio | enc GB/s 1T | dec GB/s 1T | enc GB/s " << threads << "T | dec GB/s "
        << threads << "T | enc / zstd-1 (1T) | dec / zstd-1 (1T) |\n";
    out << "|---|---|---|---|---|---|---|---|\n";
    for (const Row& r : rows) {
      out << absl::StrFormat("| %s | %.3f | %.2f | %.2f | %.2f | %.2f | %.2fx | %.2fx |\n", r.name,
                             r.ratio, r.enc1, r.dec1, r.encn, r.decn, r.enc1 / zstd1.enc1,
                             r.dec1 / zstd1.dec1);
    }
  }
  return absl::OkStatus();
}

}  // namespace gcomp::cli
