#include "cluster/wire_message.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/aggregation.grpc.pb.h"

namespace gcomp::cluster {
namespace {

proto::CompressedBlock Block(size_t n, bool raw) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(0.01f * i) * 1e-3f;
  proto::CompressedBlock b;
  codec::Policy p;
  p.mode = codec::Mode::kNearLossless;
  EXPECT_TRUE(EncodeWireBlock({raw, p}, codec::DType::kF32, v.data(), n, &b).ok());
  b.mutable_address()->set_job("job");
  b.mutable_address()->set_key("layer.0/weight");
  b.mutable_address()->set_chunk(3);
  b.mutable_address()->set_step(41);
  b.mutable_address()->set_worker(2);
  return b;
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  grpc::Slice one;
  EXPECT_TRUE(buffer.DumpToSingleSlice(&one).ok());
  return std::string(reinterpret_cast<const char*>(one.begin()), one.size());
}

// `bytes` as gRPC might hand it over: in pieces cut at `cuts`.
grpc::ByteBuffer InSlices(const std::string& bytes, std::vector<size_t> cuts) {
  std::vector<grpc::Slice> slices;
  size_t from = 0;
  cuts.push_back(bytes.size());
  for (size_t to : cuts) {
    to = std::min(to, bytes.size());
    if (to < from) continue;
    slices.emplace_back(bytes.data() + from, to - from);
    from = to;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Joined(const WireMessage& m) {
  std::string out;
  for (absl::string_view piece : m.data()) out.append(piece.data(), piece.size());
  return out;
}

TEST(WireMessage, TheMethodNameIsTheGeneratedOne) {
  EXPECT_EQ(std::string(kPushPullMethod),
            absl::StrCat("/", proto::Aggregation::service_full_name(), "/PushPull"));
}

TEST(WireMessage, SendsTheProtobufEncodingOfTheBlock) {
  for (bool raw : {true, false}) {
    const proto::CompressedBlock block = Block(5000, raw);
    WireMessage m = WireMessage::Own(block);
    EXPECT_EQ(m.data_size(), block.data().size());
    grpc::ByteBuffer buffer;
    ASSERT_TRUE(m.Serialize(&buffer).ok());
    proto::CompressedBlock parsed;
    ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
    EXPECT_EQ(parsed.SerializeAsString(), block.SerializeAsString()) << "raw " << raw;
    // A second Serialize (a retried call) sends the same bytes.
    grpc::ByteBuffer again;
    ASSERT_TRUE(m.Serialize(&again).ok());
    EXPECT_EQ(Flatten(again), Flatten(buffer));
  }
}

TEST(WireMessage, SharedPayloadOutlivesItsOwnerWhileGrpcHoldsIt) {
  auto reply = std::make_shared<proto::CompressedBlock>(Block(3000, true));
  const std::string expected = reply->data();
  proto::CompressedBlock header = *reply;
  header.clear_data();
  header.mutable_address()->set_worker(7);
  grpc::ByteBuffer buffer;
  {
    WireMessage m = WireMessage::Share(header, reply);
    reply.reset();  // the step's cache moved on; the message still holds the payload
    ASSERT_TRUE(m.Serialize(&buffer).ok());
  }
  proto::CompressedBlock parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
  EXPECT_EQ(parsed.data(), expected);
  EXPECT_EQ(parsed.address().worker(), 7u);
}

TEST(WireMessage, ReadsTheGeneratedEncodingInAnySlicing) {
  const proto::CompressedBlock block = Block(4000, false);
  // The generated code writes `data` (6) before `sections` (7) and `checksum` (8).
  const std::string bytes = block.SerializeAsString();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<size_t> cuts;
    const int count = trial % 20;
    for (int i = 0; i < count; ++i) cuts.push_back(rng() % (bytes.size() + 1));
    if (trial == 1) {  // every byte its own slice
      cuts.clear();
      for (size_t i = 1; i < 300; ++i) cuts.push_back(i);
    }
    std::sort(cuts.begin(), cuts.end());
    WireMessage m;
    ASSERT_TRUE(m.Parse(InSlices(bytes, cuts)).ok()) << "trial " << trial;
    EXPECT_TRUE(m.header().data().empty());
    EXPECT_EQ(m.header().checksum(), block.checksum());
    EXPECT_EQ(m.header().sections().mantissa_bytes(), block.sections().mantissa_bytes());
    EXPECT_EQ(m.header().address().key(), "layer.0/weight");
    EXPECT_EQ(Joined(m), block.data()) << "trial " << trial;
    EXPECT_EQ(m.ToBlock().SerializeAsString(), bytes);
    std::vector<float> out(4000);
    std::string scratch;
    EXPECT_TRUE(DecodeWireBlock(m.header(), m.data(), codec::DType::kF32, 4000, out.data(),
                                &scratch)
                    .ok());
  }
}

TEST(WireMessage, RawPayloadDecodesStraightFromThePieces) {
  const proto::CompressedBlock block = Block(1000, true);
  const std::string bytes = block.SerializeAsString();
  WireMessage m;
  ASSERT_TRUE(m.Parse(InSlices(bytes, {10, 100, 1000, 1001, 2500})).ok());
  EXPECT_GT(m.data().size(), 1u);
  std::vector<float> out(1000), want(1000);
  std::string scratch;
  ASSERT_TRUE(DecodeWireBlock(m.header(), m.data(), codec::DType::kF32, 1000, out.data(),
                              &scratch)
                  .ok());
  EXPECT_TRUE(scratch.empty());  // no joined copy for raw elements
  ASSERT_TRUE(DecodeWireBlock(block, codec::DType::kF32, 1000, want.data()).ok());
  EXPECT_EQ(out, want);
}

// Whatever bytes arrive, Parse accepts exactly what protobuf's parser accepts, and reads
// the same block. Returns whether it was accepted.
bool ExpectSameAsProtobuf(const std::string& bytes, const std::vector<size_t>& cuts) {
  proto::CompressedBlock reference;
  const bool reference_ok = reference.ParseFromString(bytes);
  WireMessage m;
  const grpc::Status s = m.Parse(InSlices(bytes, cuts));
  EXPECT_EQ(s.ok(), reference_ok) << s.error_message();
  if (!s.ok() || !reference_ok) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("malformed CompressedBlock"), std::string::npos);
    return false;
  }
  EXPECT_EQ(Joined(m), reference.data());
  reference.clear_data();
  EXPECT_EQ(m.header().SerializeAsString(), reference.SerializeAsString());
  return true;
}

TEST(WireMessage, DamagedMessagesAreReadAsProtobufReadsThem) {
  const std::string bytes = Block(600, false).SerializeAsString();
  int accepted = 0, refused = 0;
  for (size_t cut = 0; cut <= bytes.size(); ++cut) {
    ++(ExpectSameAsProtobuf(bytes.substr(0, cut), {cut / 2}) ? accepted : refused);
  }
  std::mt19937 rng(11);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string damaged = bytes;
    const int flips = 1 + trial % 4;
    for (int i = 0; i < flips; ++i) {
      // Mostly in the fields around the payload, where the structure is.
      const size_t at = (trial % 3 == 0) ? rng() % damaged.size()
                                         : rng() % std::min<size_t>(damaged.size(), 80);
      damaged[at] = static_cast<char>(rng());
    }
    if (trial % 5 == 0) damaged += damaged.substr(0, rng() % 64);  // trailing fields
    ++(ExpectSameAsProtobuf(damaged, {rng() % (damaged.size() + 1)}) ? accepted : refused);
  }
  // Both outcomes were exercised, many times.
  EXPECT_GT(accepted, 500);
  EXPECT_GT(refused, 500);
}

TEST(WireMessage, RepeatedAndMistypedDataFieldsFollowProtobuf) {
  proto::CompressedBlock a = Block(10, true), b = Block(20, true);
  // Two `data` fields: the later one wins.
  std::string twice = a.SerializeAsString() + b.SerializeAsString();
  ExpectSameAsProtobuf(twice, {5});
  // Field 6 as a varint: an unknown field, kept in the header.
  std::string mistyped = a.SerializeAsString();
  mistyped += static_cast<char>((6 << 3) | 0);
  mistyped += static_cast<char>(42);
  ExpectSameAsProtobuf(mistyped, {});
  // A tag whose varint runs past 32 bits (found by fuzzing): protobuf refuses it.
  std::string long_tag = a.SerializeAsString();
  long_tag += std::string("\xee\xae\xd6\xad\xf3\x1e\x96\xd8\x55", 9);
  EXPECT_FALSE(ExpectSameAsProtobuf(long_tag, {3}));
  // An overlong (6-byte) length of the address field: protobuf refuses it.
  std::string long_length = std::string("\x0a\x80\x80\x80\x80\x80\x00", 7) + a.SerializeAsString();
  EXPECT_FALSE(ExpectSameAsProtobuf(long_length, {}));
  // An unknown group (field 20): protobuf keeps it, and so does the header.
  std::string group = a.SerializeAsString();
  group += std::string("\xa3\x01\x08\x05\xa4\x01", 6);
  EXPECT_TRUE(ExpectSameAsProtobuf(group, {2, 40}));
  // Field number 0: protobuf refuses it.
  EXPECT_FALSE(ExpectSameAsProtobuf(a.SerializeAsString() + std::string("\x02\x00", 2), {}));
  // An empty payload.
  proto::CompressedBlock empty = a;
  empty.clear_data();
  ExpectSameAsProtobuf(empty.SerializeAsString(), {});
  WireMessage m = WireMessage::Own(empty);
  EXPECT_EQ(m.data_size(), 0u);
  grpc::ByteBuffer buffer;
  ASSERT_TRUE(m.Serialize(&buffer).ok());
  EXPECT_EQ(Flatten(buffer), empty.SerializeAsString());
}

}  // namespace
}  // namespace gcomp::cluster
