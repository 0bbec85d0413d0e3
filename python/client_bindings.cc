#include "python/bindings.h"

namespace gcomp::python {
void BindClient(pybind11::module_& m) { m.attr("HAS_CLIENT") = false; }
}  // namespace gcomp::python
