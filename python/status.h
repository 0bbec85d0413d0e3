// absl::Status -> Python exceptions at the binding boundary: bad input (InvalidArgument,
// DataLoss, NotFound, OutOfRange) raises ValueError, a timeout TimeoutError, an unreachable
// peer ConnectionError, anything else RuntimeError. The message keeps the status code.
#ifndef GCOMP_PYTHON_STATUS_H_
#define GCOMP_PYTHON_STATUS_H_

#include <string>
#include <utility>

#include <pybind11/pybind11.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gcomp::python {

inline void ThrowIfError(const absl::Status& status) {
  if (status.ok()) return;
  std::string what = status.ToString();
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
      throw pybind11::value_error(what);
    case absl::StatusCode::kDeadlineExceeded:
      PyErr_SetString(PyExc_TimeoutError, what.c_str());
      throw pybind11::error_already_set();
    case absl::StatusCode::kUnavailable:
      PyErr_SetString(PyExc_ConnectionError, what.c_str());
      throw pybind11::error_already_set();
    default:
      throw std::runtime_error(what);
  }
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> v) {
  ThrowIfError(v.status());
  return *std::move(v);
}

}  // namespace gcomp::python

#endif  // GCOMP_PYTHON_STATUS_H_
