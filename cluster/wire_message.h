// A CompressedBlock as PushPull carries it through gRPC without copying its payload.
//
// The generated stubs serialize a block into one buffer (a copy of the payload) and parse a
// received one into a `bytes` field (another copy), twice per chunk on each side. A
// WireMessage is sent as two slices, [the other fields + the payload's tag and length] and
// [the payload's own buffer], and received as the other fields plus views into the slices
// gRPC received the message in. The bytes on the wire are the protobuf encoding of the
// same CompressedBlock, so peers that use the generated stubs interoperate.
#ifndef GCOMP_CLUSTER_WIRE_MESSAGE_H_
#define GCOMP_CLUSTER_WIRE_MESSAGE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "cluster/wire_block.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "proto/block.pb.h"

namespace gcomp::cluster {

// The full name gRPC routes Aggregation.PushPull by.
inline constexpr char kPushPullMethod[] = "/gcomp.proto.Aggregation/PushPull";

class WireMessage {
 public:
  WireMessage() = default;
  WireMessage(WireMessage&&) = default;
  WireMessage& operator=(WireMessage&&) = default;
  // Received pieces point into slices this object holds; copying would need new views.
  WireMessage(const WireMessage&) = delete;
  WireMessage& operator=(const WireMessage&) = delete;

  // Sends `block`; its payload is moved into the message, not copied.
  static WireMessage Own(proto::CompressedBlock block);
  // Sends `header`'s fields (its `data` must be empty) with `payload->data()` as the payload,
  // without copying it: `payload` is kept alive until gRPC has written it.
  static WireMessage Share(proto::CompressedBlock header,
                           std::shared_ptr<const proto::CompressedBlock> payload);

  // Every field but `data` (a sender may change them between sends, e.g. the map epoch).
  const proto::CompressedBlock& header() const { return header_; }
  proto::CompressedBlock* mutable_header() { return &header_; }
  // The payload, in order (empty for an empty payload).
  WirePieces data() const { return pieces_; }
  size_t data_size() const;
  // The whole block as one protobuf (copies the payload), for callers that keep it.
  proto::CompressedBlock ToBlock() const;

  // For grpc::SerializationTraits. Serialize can be called again (a retried call).
  grpc::Status Serialize(grpc::ByteBuffer* out) const;
  // Accepts exactly what protobuf's parser accepts (InvalidArgument otherwise) and reads
  // the same fields and payload.
  grpc::Status Parse(const grpc::ByteBuffer& in);

 private:
  // The usual case, without copying the payload: false where protobuf must decide.
  bool ParseInPlace(size_t total);

  proto::CompressedBlock header_;
  std::vector<absl::string_view> pieces_;
  std::shared_ptr<const void> keep_;  // owns a sent payload
  std::vector<grpc::Slice> slices_;   // hold a received message's bytes
};

// Aggregation.PushPull with WireMessages over a channel (the generated stub's other
// methods are unaffected).
class PushPullStub {
 public:
  explicit PushPullStub(std::shared_ptr<grpc::ChannelInterface> channel);
  grpc::Status PushPull(grpc::ClientContext* context, const WireMessage& request,
                        WireMessage* response);

 private:
  const std::shared_ptr<grpc::ChannelInterface> channel_;
  const grpc::internal::RpcMethod method_;
};

}  // namespace gcomp::cluster

namespace grpc {

template <>
class SerializationTraits<gcomp::cluster::WireMessage> {
 public:
  static Status Serialize(const gcomp::cluster::WireMessage& message, ByteBuffer* out,
                          bool* own_buffer) {
    *own_buffer = true;
    return message.Serialize(out);
  }
  static Status Deserialize(ByteBuffer* in, gcomp::cluster::WireMessage* message) {
    Status s = message->Parse(*in);
    in->Clear();
    return s;
  }
};

}  // namespace grpc

#endif  // GCOMP_CLUSTER_WIRE_MESSAGE_H_
