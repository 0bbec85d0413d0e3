#include "cluster/wire_message.h"

#include <atomic>
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

// What a sent payload slice holds: a reference to the payload's owner. gRPC drops the
// slice on a thread of its own, after handing it over through its own (uninstrumented)
// synchronization; the flag makes that handover visible to ThreadSanitizer too.
struct PayloadRef {
  explicit PayloadRef(std::shared_ptr<const void> owner) : keep(std::move(owner)) {
    published.store(true, std::memory_order_release);
  }
  std::shared_ptr<const void> keep;
  std::atomic<bool> published{false};
};

void DropPayloadRef(void* ref) {
  auto* r = static_cast<PayloadRef*>(ref);
  (void)r->published.load(std::memory_order_acquire);
  delete r;
}

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
    slices.emplace_back(const_cast<char*>(piece.data()), piece.size(), &DropPayloadRef,
                        new PayloadRef(keep_));
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
  if (ParseInPlace(total)) return grpc::Status::OK;

  // Anything the fast reader does not handle exactly as protobuf does (groups, overlong
  // tags and lengths, cut-off fields, field number 0): protobuf decides, on one copy.
  header_.Clear();
  pieces_.clear();
  auto whole = std::make_shared<std::string>();
  whole->reserve(total);
  for (const grpc::Slice& s : slices_) {
    whole->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  slices_.clear();
  proto::CompressedBlock block;
  if (!block.ParseFromString(*whole)) return Malformed("the bytes do not parse as protobuf");
  *this = Own(std::move(block));
  return grpc::Status::OK;
}

bool WireMessage::ParseInPlace(size_t total) {
  // Every field but `data` is re-encoded, value for value, into `head` and parsed from
  // there; the payload stays in the slices. A repeated `data` field replaces the earlier
  // one, as in protobuf. Returns false where protobuf must decide.
  SliceInputStream stream(slices_);
  google::protobuf::io::CodedInputStream input(&stream);
  std::string head;
  {
    google::protobuf::io::StringOutputStream head_stream(&head);
    google::protobuf::io::CodedOutputStream out(&head_stream);
    // A tag or a length in at most 5 bytes, as protobuf's parser requires.
    auto read_short = [&](uint64_t* value) {
      const int before = input.CurrentPosition();
      return input.ReadVarint64(value) && input.CurrentPosition() - before <= 5;
    };
    while (static_cast<size_t>(input.CurrentPosition()) < total) {
      uint64_t tag = 0;
      if (!read_short(&tag) || tag > UINT32_MAX) return false;
      const int field = WireFormatLite::GetTagFieldNumber(static_cast<uint32_t>(tag));
      if (field == 0) return false;
      const WireFormatLite::WireType type =
          WireFormatLite::GetTagWireType(static_cast<uint32_t>(tag));
      // Every field but the payload goes to `head`, tag first (a field that turns out cut
      // off returns false, and `head` is dropped).
      if (type != WireFormatLite::WIRETYPE_LENGTH_DELIMITED || field != kDataField) {
        out.WriteVarint32(static_cast<uint32_t>(tag));
      }
      switch (type) {
        case WireFormatLite::WIRETYPE_VARINT: {
          uint64_t v = 0;
          if (!input.ReadVarint64(&v)) return false;
          out.WriteVarint64(v);
          break;
        }
        case WireFormatLite::WIRETYPE_FIXED64: {
          uint64_t v = 0;
          if (!input.ReadLittleEndian64(&v)) return false;
          out.WriteLittleEndian64(v);
          break;
        }
        case WireFormatLite::WIRETYPE_FIXED32: {
          uint32_t v = 0;
          if (!input.ReadLittleEndian32(&v)) return false;
          out.WriteLittleEndian32(v);
          break;
        }
        case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
          uint64_t length = 0;
          if (!read_short(&length) ||
              length > total - static_cast<size_t>(input.CurrentPosition())) {
            return false;
          }
          if (field != kDataField) {
            std::string value;
            if (!input.ReadString(&value, static_cast<int>(length))) return false;
              out.WriteVarint64(length);
            out.WriteString(value);
            break;
          }
          pieces_.clear();
          while (length > 0) {
            const void* at = nullptr;
            int available = 0;
            if (!input.GetDirectBufferPointer(&at, &available) || available <= 0) return false;
            const uint64_t take = std::min<uint64_t>(length, static_cast<uint64_t>(available));
            pieces_.emplace_back(static_cast<const char*>(at), take);
            input.Skip(static_cast<int>(take));
            length -= take;
          }
          break;
        }
        default:  // groups and invalid wire types
          return false;
      }
    }
    if (out.HadError()) return false;
  }
  return header_.ParseFromString(head);
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
