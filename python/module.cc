// The `_gcomp` Python extension: codec and worker-client bindings (see gcomp/ for the
// Python API built on top). Every call that encodes, decodes or talks to the network
// releases the GIL.
#include <pybind11/pybind11.h>

#include "base/mutex_mode.h"
#include "python/bindings.h"

namespace gcomp::python {

ContiguousBuffer RequestContiguous(const pybind11::buffer& obj, bool writable) {
  ContiguousBuffer b;
  b.info = obj.request(writable);
  ssize_t expected = b.info.itemsize;
  for (ssize_t d = b.info.ndim - 1; d >= 0; --d) {
    if (b.info.shape[d] > 1 && b.info.strides[d] != expected) {
      throw pybind11::value_error("buffer must be C-contiguous");
    }
    expected *= b.info.shape[d];
  }
  b.data = static_cast<uint8_t*>(b.info.ptr);
  b.size = static_cast<size_t>(b.info.size) * static_cast<size_t>(b.info.itemsize);
  return b;
}

}  // namespace gcomp::python

PYBIND11_MODULE(_gcomp, m) {
  m.doc() = "GComp gradient codec and parameter-server client";
  gcomp::DisableMutexDeadlockDetection();
  gcomp::python::BindCodec(m);
  gcomp::python::BindClient(m);
}
