// Registration functions of the `_gcomp` extension, one per bound layer.
#ifndef GCOMP_PYTHON_BINDINGS_H_
#define GCOMP_PYTHON_BINDINGS_H_

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>

namespace gcomp::python {

// A C-contiguous byte range of a buffer-protocol object (numpy array, CPU tensor via
// .numpy(), bytes, bytearray); `info` keeps the export alive while the range is used.
struct ContiguousBuffer {
  pybind11::buffer_info info;
  uint8_t* data = nullptr;
  size_t size = 0;  // bytes
};
// Throws ValueError ("buffer must be C-contiguous") for strided views.
ContiguousBuffer RequestContiguous(const pybind11::buffer& obj, bool writable);

// Adds encode/decode over numpy arrays and buffer-protocol objects (codec_bindings.cc).
void BindCodec(pybind11::module_& m);
// Adds the worker Client (client_bindings.cc).
void BindClient(pybind11::module_& m);

}  // namespace gcomp::python

#endif  // GCOMP_PYTHON_BINDINGS_H_
