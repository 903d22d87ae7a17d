#include "errors.h"

#include <Python.h>

#include <string>

#include "bindings.h"
#include "process_workers.h"

namespace stoker::python {
namespace {

namespace py = pybind11;

// Owned by the module object (kept alive by it); set once at import.
PyObject* g_data_error = nullptr;
PyObject* g_resource_error = nullptr;
PyObject* g_cancelled = nullptr;

PyObject* ExceptionTypeFor(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
      return PyExc_ValueError;
    case StatusCode::kNotFound:
      return PyExc_FileNotFoundError;
    case StatusCode::kIoError:
      return PyExc_OSError;
    case StatusCode::kDataError:
    case StatusCode::kUnsupported:
      return g_data_error;
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnavailable:
      return g_resource_error;
    case StatusCode::kCancelled:
      return g_cancelled;
    case StatusCode::kOutOfRange:
      return PyExc_IndexError;
    default:
      return PyExc_RuntimeError;
  }
}

// A failed sample's fields on its exception, for stoker.DataLoader to raise
// it as the sample's own type (python/stoker/_errors.py): index, key and
// worker (None where there is none: a batch's own failure has no index),
// and `_sample`: (pickled exception or None, the worker's traceback, thread
// batch ticket or None, failure).
void SetSampleFields(py::handle exc, const SampleDetail& s) {
  exc.attr("index") =
      s.index == SampleDetail::kNoSample ? py::object(py::none()) : py::int_(s.index);
  exc.attr("key") = s.key.empty() ? py::object(py::none()) : DecodeText(s.key);
  const auto* d = dynamic_cast<const SampleErrorDetail*>(&s);
  if (d == nullptr) return;
  exc.attr("worker") = d->worker < 0 ? py::object(py::none()) : py::int_(d->worker);
  exc.attr("_sample") = py::make_tuple(
      d->exception.empty() ? py::object(py::none()) : py::bytes(d->exception),
      DecodeText(d->traceback),
      d->batch_ticket == 0 ? py::object(py::none()) : py::int_(d->batch_ticket), d->failure);
}

// The type a status is raised as: its code's, but a failed sample's error
// of another code (a file missing, a read error) is a DataError too, of the
// code's type as well (stoker._errors combines them): `except DataError`
// catches every bad sample, `except FileNotFoundError` still catches it.
py::object RaisedType(const Status& status, const SampleDetail* sample) {
  PyObject* type = ExceptionTypeFor(status.code());
  py::object specific;  // an OSError's subclass for its errno, as Python picks it
  if (status.os_error() != 0 && PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(type),
                                                 reinterpret_cast<PyTypeObject*>(PyExc_OSError))) {
    specific =
        py::type::of(py::reinterpret_borrow<py::object>(PyExc_OSError)(status.os_error(), ""));
    type = specific.ptr();
  }
  if (sample != nullptr && sample->index != SampleDetail::kNoSample && type != g_data_error &&
      IsSampleError(status)) {
    py::object both = py::module_::import("stoker._errors").attr("data_error_of")(py::handle(type));
    if (!both.is_none()) return both;
  }
  return py::reinterpret_borrow<py::object>(type);
}

void SetPythonError(const Status& status) {
  // Paths are bytes and need not be UTF-8; keep whatever is undecodable visible.
  py::str text = DecodeText(status.message());
  if (!text) return;  // the decoder set an error already
  const auto* sample = dynamic_cast<const SampleDetail*>(status.detail().get());
  py::object type_object;
  try {
    type_object = RaisedType(status, sample);
  } catch (const py::error_already_set&) {  // cleared as caught: the code's own type
    type_object = py::reinterpret_borrow<py::object>(ExceptionTypeFor(status.code()));
  }
  PyObject* type = type_object.ptr();
  py::object exc = py::reinterpret_steal<py::object>(PyObject_CallOneArg(type, text.ptr()));
  if (!exc) return;
  if (PyObject_SetAttrString(exc.ptr(), "code", py::str(StatusCodeName(status.code())).ptr()) !=
      0) {
    PyErr_Clear();  // the message alone still says what happened
  }
  if (status.os_error() != 0 && PyObject_IsInstance(exc.ptr(), PyExc_OSError) == 1 &&
      PyObject_SetAttrString(exc.ptr(), "errno", py::int_(status.os_error()).ptr()) != 0) {
    PyErr_Clear();
  }
  if (sample != nullptr) {
    try {
      SetSampleFields(exc, *sample);
    } catch (const py::error_already_set&) {
      // Cleared as it was caught: the message alone still says what happened.
    }
  }
  PyErr_SetObject(type, exc.ptr());
}

PyObject* NewException(py::module_& m, const char* name, PyObject* base, const char* doc,
                       py::dict attributes = {}) {
  std::string qualified = std::string("stoker.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base, attributes.ptr());
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(type));
  return type;
}

}  // namespace

void RegisterErrors(py::module_& m) {
  // A ValueError, as it always was: `except ValueError` around stoker.Loader
  // keeps working, and a sample's error still combines with every built-in
  // exception type it may be raised as (python/stoker/_errors.py).
  g_data_error = NewException(
      m, "DataError", PyExc_ValueError,
      "A sample could not be loaded: its bytes are not a valid image (corrupt, truncated, or a "
      "kind this build cannot decode), or a Python dataset raised for it. The message names "
      "the sample and its file. From stoker.DataLoader it is also of the sample's own "
      "exception type (except OSError catches it, as with torch), with the original as "
      "__cause__; index, key and worker say which sample failed where (None when unknown).",
      py::dict(py::arg("index") = py::none(), py::arg("key") = py::none(),
               py::arg("worker") = py::none()));
  g_resource_error = NewException(
      m, "ResourceError", PyExc_RuntimeError,
      "A budget or cap was hit (an image over max_pixels, a sample over its share of the memory "
      "budget), the machine refused memory, file descriptors or threads, or the store is gone "
      "or out of reach. on_error='skip' skips and records a sample over a cap (it is refused "
      "unread); what the machine or the store refused is never skipped: it is not the "
      "sample's fault.");
  g_cancelled = NewException(m, "Cancelled", PyExc_RuntimeError, "The loader was stopped.");
  // The engine's errno classes, for Python datasets' OSErrors (one list: ErrnoError's).
  m.def(
      "errno_is_sample_error", [](int err) { return IsSampleError(ErrnoError("", err)); },
      py::arg("errno"),
      "Whether an OSError with this errno may be the sample's fault (skippable); False for a "
      "refused resource or a store gone or out of reach.");
  m.def(
      "errno_message",
      [](const std::string& what, int err) { return ErrnoError(what, err).message(); },
      py::arg("what"), py::arg("errno"),
      "The engine's text for an OSError's errno met doing `what`: its strerror, and for a limit "
      "(RLIMIT_NOFILE) which one and the way out.");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      SetPythonError(e.status());
    }
  });
}

}  // namespace stoker::python
