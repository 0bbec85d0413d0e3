#include "cluster/wire_message.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"

namespace gcomp::cluster {
namespace {

using google::protobuf::internal::WireFormatLite;

constexpr int kDataField = proto::CompressedBlock::kDataFieldNumber;

// The received slices as one protobuf input stream, read where they lie.
class SliceInputStream final : public google::protobuf::io::ZeroCopyInputStream {
 public:
  explicit SliceInputStream(const std::vector<grpc::Slice>& slices) : slices_(slices) {}

  bool Next(const void** data, int* size) override {
    if (backed_up_ > 0) {  // hand back the tail of the last piece first
      const grpc::Slice& s = slices_[index_ - 1];
      *data = s.begin() + (s.size() - backed_up_);
      *size = static_cast<int>(backed_up_);
      position_ += backed_up_;
      backed_up_ = 0;
      return true;
    }
    while (index_ < slices_.size() && slices_[index_].size() == 0) ++index_;
    if (index_ == slices_.size()) return false;
    const grpc::Slice& s = slices_[index_++];
    *data = s.begin();
    *size = static_cast<int>(s.size());
    position_ += s.size();
    return true;
  }
  void BackUp(int count) override {
    backed_up_ = static_cast<size_t>(count);
    position_ -= backed_up_;
  }
  bool Skip(int count) override {
    const void* data;
    int size;
    while (count > 0) {
      if (!Next(&data, &size)) return false;
      if (size > count) {
        BackUp(size - count);
        return true;
      }
      count -= size;
    }
    return true;
  }
  int64_t ByteCount() const override { return static_cast<int64_t>(position_); }

 private:
  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t backed_up_ = 0;
  size_t position_ = 0;
};

grpc::Status Malformed(absl::string_view what) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("malformed CompressedBlock message: ", what));
}

void DropSharedPayload(void* keep) { delete static_cast<std::shared_ptr<const void>*>(keep); }

}  // namespace

WireMessage WireMessage::Own(proto::CompressedBlock block) {
  auto payload = std::make_shared<std::string>(std::move(*block.mutable_data()));
  block.clear_data();
  WireMessage m;
  m.header_ = std::move(block);
  if (!payload->empty()) m.pieces_.push_back(*payload);
  m.keep_ = std::move(payload);
  return m;
}

WireMessage WireMessage::Share(proto::CompressedBlock header,
                               std::shared_ptr<const proto::CompressedBlock> payload) {
  WireMessage m;
  m.header_ = std::move(header);
  m.header_.clear_data();
  if (!payload->data().empty()) m.pieces_.push_back(payload->data());
  m.keep_ = std::move(payload);
  return m;
}

size_t WireMessage::data_size() const {
  size_t total = 0;
  for (absl::string_view piece : pieces_) total += piece.size();
  return total;
}

proto::CompressedBlock WireMessage::ToBlock() const {
  proto::CompressedBlock block = header_;
  std::string* data = block.mutable_data();
  data->reserve(data_size());
  for (absl::string_view piece : pieces_) data->append(piece.data(), piece.size());
  return block;
}

grpc::Status WireMessage::Serialize(grpc::ByteBuffer* out) const {
  std::string head;
  if (!header_.AppendToString(&head)) return Malformed("the header fields do not serialize");
  const size_t size = data_size();
  if (size > 0) {
    google::protobuf::io::StringOutputStream stream(&head);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.WriteTag(WireFormatLite::MakeTag(kDataField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    coded.WriteVarint64(size);
  }
  std::vector<grpc::Slice> slices;
  slices.reserve(1 + pieces_.size());
  slices.emplace_back(head);
  for (absl::string_view piece : pieces_) {
    // The slice holds a reference to the payload's owner, however long gRPC keeps it.
    slices.emplace_back(const_cast<char*>(piece.data()), piece.size(), &DropSharedPayload,
                        new std::shared_ptr<const void>(keep_));
  }
  *out = grpc::ByteBuffer(slices.data(), slices.size());
  return grpc::Status::OK;
}

grpc::Status WireMessage::Parse(const grpc::ByteBuffer& in) {
  header_.Clear();
  pieces_.clear();
  keep_.reset();
  slices_.clear();
  if (grpc::Status s = in.Dump(&slices_); !s.ok()) return s;
  size_t total = 0;
  for (const grpc::Slice& s : slices_) total += s.size();

  // Every field but `data` is copied, as it came, into `head` and parsed from there; the
  // payload stays in the slices. A repeated `data` field replaces the earlier one, as in
  // protobuf; `data` with another wire type is an unknown field, as in protobuf.
  SliceInputStream stream(slices_);
  google::protobuf::io::CodedInputStream input(&stream);
  std::string head;
  {
    google::protobuf::io::StringOutputStream head_stream(&head);
    google::protobuf::io::CodedOutputStream head_out(&head_stream);
    for (;;) {
      const uint32_t tag = input.ReadTag();
      if (tag == 0) break;
      if (WireFormatLite::GetTagFieldNumber(tag) == kDataField &&
          WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
        uint32_t length = 0;
        if (!input.ReadVarint32(&length)) return Malformed("the payload's length is cut off");
        if (length > total) return Malformed("the payload's length exceeds the message");
        pieces_.clear();
        while (length > 0) {
          const void* at = nullptr;
          int available = 0;
          if (!input.GetDirectBufferPointer(&at, &available) || available <= 0) {
            return Malformed("the payload is cut off");
          }
          const uint32_t take = std::min<uint32_t>(length, static_cast<uint32_t>(available));
          pieces_.emplace_back(static_cast<const char*>(at), take);
          input.Skip(static_cast<int>(take));
          length -= take;
        }
        continue;
      }
      if (!WireFormatLite::SkipField(&input, tag, &head_out)) {
        return Malformed("a field is cut off or invalid");
      }
    }
    if (head_out.HadError()) return Malformed("the header fields do not copy");
  }
  if (static_cast<size_t>(input.CurrentPosition()) != total) {
    return Malformed(absl::StrCat("stopped at byte ", input.CurrentPosition(), " of ", total));
  }
  if (!header_.ParseFromString(head)) return Malformed("the header fields do not parse");
  return grpc::Status::OK;
}

PushPullStub::PushPullStub(std::shared_ptr<grpc::ChannelInterface> channel)
    : channel_(std::move(channel)),
      method_(kPushPullMethod, grpc::internal::RpcMethod::NORMAL_RPC, channel_) {}

grpc::Status PushPullStub::PushPull(grpc::ClientContext* context, const WireMessage& request,
                                    WireMessage* response) {
  return grpc::internal::BlockingUnaryCall<WireMessage, WireMessage>(channel_.get(), method_,
                                                                     context, request, response);
}

}  // namespace gcomp::cluster
