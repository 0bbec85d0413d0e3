// Codec bindings: encode/decode whole frames (codec::EncodeBuffer / DecodeBuffer) on any
// C-contiguous buffer-protocol object (numpy arrays, tensor.numpy() views, bytearrays),
// without copying the input; the GIL is released while the codec runs.
#include <cstdint>
#include <string>

#include <pybind11/pybind11.h>

#include "absl/status/status.h"
#include "codec/codec.h"
#include "python/bindings.h"
#include "python/status.h"

namespace py = pybind11;

namespace gcomp::python {
namespace {


codec::DType DTypeOf(const std::string& name) { return ValueOrThrow(codec::ParseDType(name)); }

size_t ElementsOf(const ContiguousBuffer& b, codec::DType dtype) {
  size_t width = codec::DTypeBytes(dtype);
  if (b.size % width != 0) {
    throw py::value_error("buffer size " + std::to_string(b.size) +
                          " is not a whole number of " + std::string(codec::DTypeName(dtype)) +
                          " elements");
  }
  return b.size / width;
}

codec::Policy PolicyOf(const std::string& mode, int rel_bits, int abs_log2) {
  codec::Policy policy;
  policy.mode = ValueOrThrow(codec::ParseMode(mode));
  policy.rel_bits = rel_bits;
  policy.abs_log2 = abs_log2;
  ThrowIfError(codec::ValidatePolicy(policy));
  return policy;
}

py::bytes Encode(const py::buffer& data, const std::string& dtype_name, const std::string& mode,
                 int rel_bits, int abs_log2, size_t block_bytes, int threads) {
  ContiguousBuffer in = RequestContiguous(data, /*writable=*/false);
  codec::DType dtype = DTypeOf(dtype_name);
  size_t n = ElementsOf(in, dtype);
  codec::BufferOptions options;
  options.policy = PolicyOf(mode, rel_bits, abs_log2);
  options.block_bytes = block_bytes;
  options.threads = threads;
  std::string out;
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = codec::EncodeBuffer(dtype, in.data, n, options, &out);
  }
  ThrowIfError(status);
  return py::bytes(out);
}

void Decode(const py::buffer& frame, const py::buffer& out, const std::string& dtype_name,
            int threads) {
  ContiguousBuffer in = RequestContiguous(frame, /*writable=*/false);
  ContiguousBuffer dst = RequestContiguous(out, /*writable=*/true);
  codec::DType dtype = DTypeOf(dtype_name);
  size_t n = ElementsOf(dst, dtype);
  absl::Status status;
  {
    py::gil_scoped_release release;
    status = codec::DecodeBuffer(absl::Span<const uint8_t>(in.data, in.size), dtype,
                                 const_cast<uint8_t*>(dst.data), n, threads);
  }
  ThrowIfError(status);
}

py::dict InspectFrame(const py::buffer& frame) {
  ContiguousBuffer in = RequestContiguous(frame, /*writable=*/false);
  codec::FrameInfo info =
      ValueOrThrow(codec::InspectFrame(absl::Span<const uint8_t>(in.data, in.size)));
  py::dict d;
  d["dtype"] = std::string(codec::DTypeName(info.dtype));
  d["elements"] = info.elements;
  d["block_elements"] = info.block_elements;
  d["blocks"] = info.blocks.size();
  return d;
}

}  // namespace

void BindCodec(py::module_& m) {
  m.attr("HAS_CODEC") = true;
  m.def("encode", &Encode, py::arg("data"), py::arg("dtype"), py::arg("mode"),
        py::arg("rel_bits") = 7, py::arg("abs_log2") = -16,
        py::arg("block_bytes") = size_t{1} << 20, py::arg("threads") = 1,
        "Encodes a C-contiguous buffer of `dtype` elements into one frame (bytes).");
  m.def("decode", &Decode, py::arg("frame"), py::arg("out"), py::arg("dtype"),
        py::arg("threads") = 1,
        "Decodes a frame into a writable C-contiguous buffer of the frame's size.");
  m.def(
      "max_encoded_bytes",
      [](size_t n, const std::string& dtype, size_t block_bytes) {
        return codec::MaxEncodedBytes(n, DTypeOf(dtype), block_bytes);
      },
      py::arg("n"), py::arg("dtype") = "f32", py::arg("block_bytes") = size_t{1} << 20);
  m.def(
      "error_bound",
      [](const std::string& mode, int rel_bits, int abs_log2, double x, double block_max_abs) {
        return codec::ErrorBound(PolicyOf(mode, rel_bits, abs_log2), x, block_max_abs);
      },
      py::arg("mode"), py::arg("rel_bits"), py::arg("abs_log2"), py::arg("x"),
      py::arg("block_max_abs"), "The guaranteed error bound for one element (see codec.h).");
  m.def("inspect_frame", &InspectFrame, py::arg("frame"));
}

}  // namespace gcomp::python
