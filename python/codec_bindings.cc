#include "python/bindings.h"

namespace gcomp::python {
void BindCodec(pybind11::module_& m) { m.attr("HAS_CODEC") = false; }
}  // namespace gcomp::python
