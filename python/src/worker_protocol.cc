// `_stoker.protocol`: worker_protocol.h as Python reads it, by name.

#include "worker_protocol.h"

#include <pybind11/pybind11.h>

#include "bindings.h"

namespace stoker::python {
namespace {

namespace py = pybind11;

// A layout as a namespace: `fields` (names in order), `words` (how many are
// reserved) and each name's position, e.g. protocol.TASK.batch == 1.
py::object Layout(py::list names, int reserved) {
  py::dict fields;
  for (size_t i = 0; i < names.size(); ++i) fields[names[i]] = py::int_(i);
  fields["fields"] = py::tuple(names);
  fields["words"] = reserved < 0 ? py::int_(names.size()) : py::int_(reserved);
  return py::module_::import("types").attr("SimpleNamespace")(**fields);
}

#define STOKER_PROTOCOL_NAME(Cpp, py_name) names.append(#py_name);
#define STOKER_PROTOCOL_LAYOUT(Words, reserved)                 \
  [] {                                                          \
    py::list names;                                             \
    Words(STOKER_PROTOCOL_NAME) return Layout(names, reserved); \
  }()

}  // namespace

void BindWorkerProtocol(py::module_& m) {
  using namespace protocol;
  py::module_ p = m.def_submodule(
      "protocol", "What crosses the process boundary to worker processes (worker_protocol.h)");
  p.attr("TAG_BYTES") = kTagBytes;
  p.attr("MAX_MESSAGE_BYTES") = kMaxMessageBytes;
  // Each message: its tag (bytes), whether it carries text, and its words.
#define STOKER_PROTOCOL_BIND_MESSAGE(Cpp, TAG, Words, text) \
  {                                                         \
    py::object layout = STOKER_PROTOCOL_LAYOUT(Words, -1);  \
    layout.attr("tag") = py::bytes(#TAG);                   \
    layout.attr("text") = text;                             \
    p.attr(#TAG) = layout;                                  \
  }
  STOKER_MESSAGES(STOKER_PROTOCOL_BIND_MESSAGE)
#undef STOKER_PROTOCOL_BIND_MESSAGE
  p.attr("SEGMENT_HEADER") = STOKER_PROTOCOL_LAYOUT(STOKER_SEGMENT_HEADER, kSegmentHeaderWords);
  p.attr("PROCESS_DESCRIPTOR") = STOKER_PROTOCOL_LAYOUT(STOKER_PROCESS_DESCRIPTOR, -1);
  p.attr("THREAD_DESCRIPTOR") = STOKER_PROTOCOL_LAYOUT(STOKER_THREAD_DESCRIPTOR, -1);
  p.attr("NATIVE_BATCH") = STOKER_PROTOCOL_LAYOUT(STOKER_NATIVE_BATCH, -1);
  p.attr("SEGMENT_MAGIC") = kSegmentMagic;
  p.attr("NATIVE_MAGIC") = kNativeMagic;
  p.attr("THREAD_MAGIC") = kThreadMagic;
  p.attr("REMOTE_MAGIC") = kRemoteMagic;
  p.attr("SEGMENT_GRAIN") = kSegmentGrain;
  p.attr("DATA_ALIGN") = kDataAlign;
}

}  // namespace stoker::python
