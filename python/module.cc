// The `_gcomp` Python extension: codec and worker-client bindings (see gcomp/ for the
// Python API built on top). Every call that encodes, decodes or talks to the network
// releases the GIL.
#include <pybind11/pybind11.h>

#include "python/bindings.h"

PYBIND11_MODULE(_gcomp, m) {
  m.doc() = "GComp gradient codec and parameter-server client";
  gcomp::python::BindCodec(m);
  gcomp::python::BindClient(m);
}
