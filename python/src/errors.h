#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <utility>

#include "stoker/status.h"

namespace stoker::python {

/// Carries a non-ok Status out of a binding; the translator registered by
/// RegisterErrors turns it into the Python exception for its code. Thrown
/// only through ThrowIfError / ValueOrThrow.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return status_.message().c_str(); }

 private:
  Status status_;
};

/// Throws StatusError when `status` is an error.
inline void ThrowIfError(const Status& status) {
  if (!status.ok()) throw StatusError(status);
}

/// The value of `result`, or throws StatusError with its status.
template <typename T>
T ValueOrThrow(Result<T> result) {
  ThrowIfError(result.status());
  return std::move(result).value();
}

/// Defines stoker.Error (base of the module's own exceptions) and
/// stoker.DataError, and registers the one place where a Status becomes a
/// Python exception:
///   kInvalidArgument          -> ValueError
///   kNotFound                 -> FileNotFoundError
///   kIoError                  -> OSError
///   kDataError, kUnsupported  -> stoker.DataError (a ValueError)
///   kResourceExhausted        -> stoker.ResourceError (a RuntimeError)
///   kCancelled                -> stoker.Cancelled (a RuntimeError)
///   kFailedPrecondition       -> RuntimeError (a loader used in a forked child)
///   kOutOfRange               -> IndexError (a sampler's index past the data set)
///   kInternal and the rest    -> RuntimeError
/// Each exception gets a `code` attribute holding StatusCodeName(code); one
/// whose status carries a SampleErrorDetail (a Python dataset's failed
/// sample) also gets the sample's index, key and worker, and what
/// stoker.DataLoader needs to raise it as the sample's own exception type.
void RegisterErrors(pybind11::module_& m);

}  // namespace stoker::python
