// Registration functions of the `_gcomp` extension, one per bound layer.
#ifndef GCOMP_PYTHON_BINDINGS_H_
#define GCOMP_PYTHON_BINDINGS_H_

#include <pybind11/pybind11.h>

namespace gcomp::python {

// Adds encode/decode over numpy arrays and buffer-protocol objects (codec_bindings.cc).
void BindCodec(pybind11::module_& m);
// Adds the worker Client (client_bindings.cc).
void BindClient(pybind11::module_& m);

}  // namespace gcomp::python

#endif  // GCOMP_PYTHON_BINDINGS_H_
