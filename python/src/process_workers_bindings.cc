// _stoker.ProcessWorkers and _stoker.EpochBatches: process_workers.h as
// stoker.DataLoader's worker processes (python/stoker/_workers.py) use it.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>

#include "bindings.h"
#include "core/fd_registry.h"
#include "errors.h"
#include "process_workers.h"

namespace stoker::python {
namespace {

namespace py = pybind11;

// A delivered batch's segment as a numpy uint8 array whose base owns the
// mapping and `keep` (the engine's descriptor array, which owns the engine's
// slot): the segment goes back to the pool when the last view of it is gone.
py::array ViewOf(ProcessWorkers& workers, py::array_t<int64_t> descriptor) {
  using D = protocol::ProcessDescriptor;
  if (descriptor.size() < kDescriptorWords ||
      descriptor.data()[D::kMagic] != protocol::kSegmentMagic) {
    throw py::value_error("not a batch descriptor");
  }
  const int64_t* d = descriptor.data();
  SegmentView view = ValueOrThrow(
      workers.View(static_cast<int>(d[D::kSegment]), static_cast<uint64_t>(d[D::kTicket])));
  struct Keep {
    std::shared_ptr<Mapping> map;
    py::object descriptor;
  };
  void* addr = view.map->addr;
  const auto size = static_cast<py::ssize_t>(view.map->size);
  auto* keep = new Keep{std::move(view.map), descriptor};
  py::capsule base(keep, [](void* p) { delete static_cast<Keep*>(p); });
  py::array array(py::dtype("uint8"), {size}, static_cast<uint8_t*>(addr), base);
  return array;
}

// view() of a part of an item still being made (PartOf): the segment is held
// (ProcessWorkers::Hold) until the last view of it is gone, so that it does
// not go back to the pool (and get written) under the consumer's tensors.
py::array PartViewOf(const std::shared_ptr<ProcessWorkers>& workers,
                     py::array_t<int64_t> descriptor) {
  using D = protocol::ProcessDescriptor;
  if (descriptor.size() < kDescriptorWords ||
      descriptor.data()[D::kMagic] != protocol::kSegmentMagic) {
    throw py::value_error("not a batch descriptor");
  }
  const int64_t* d = descriptor.data();
  const auto segment = static_cast<int>(d[D::kSegment]);
  const auto ticket = static_cast<uint64_t>(d[D::kTicket]);
  ThrowIfError(workers->Hold(segment, ticket));
  struct Held {  // one Hold, let go once
    Held(std::weak_ptr<ProcessWorkers> w, int s, uint64_t t)
        : workers(std::move(w)), segment(s), ticket(t) {}
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    ~Held() {
      if (auto w = workers.lock()) w->Unhold(segment, ticket);
    }
    std::weak_ptr<ProcessWorkers> workers;
    int segment;
    uint64_t ticket;
    py::object view;
  };
  auto held = std::make_unique<Held>(workers, segment, ticket);
  held->view = ViewOf(*workers, descriptor);  // a stale one raises; `held` lets go
  py::buffer_info info = held->view.cast<py::array>().request();
  py::capsule base(held.release(), [](void* p) { delete static_cast<Held*>(p); });
  return py::array(py::dtype("uint8"), {info.size}, static_cast<uint8_t*>(info.ptr), base);
}

}  // namespace

void BindProcessWorkers(py::module_& m) {
  m.def("batch_seed", &BatchSeed, py::arg("seed"), py::arg("epoch"), py::arg("batch"),
        "The seed a worker gives Python's, numpy's and torch's generators before a batch's "
        "first sample (batch -1: the epoch's shuffle).");
  m.def("register_fd", &RegisterFd, py::arg("fd"));
  m.def("unregister_fd", &UnregisterFd, py::arg("fd"));
  m.def("close_registered_fds", &CloseRegisteredFds, py::arg("keep") = -1,
        "In a forked child: closes the segments and sockets of every stoker loader.");

  py::class_<EpochBatches, std::shared_ptr<EpochBatches>>(m, "EpochBatches")
      .def(py::init<int64_t, std::string, std::vector<std::string>>(), py::arg("first_batches"),
           py::arg("item_name") = "batch", py::arg("shards") = std::vector<std::string>{})
      .def_readonly_static("SHARD", &EpochBatches::kShard)
      .def(
          "set",
          [](EpochBatches& b, int64_t epoch, std::vector<int64_t> flat,
             std::vector<int64_t> offsets, int64_t seed, std::vector<py::bytes> keys) {
            std::vector<std::string> blobs(keys.begin(), keys.end());
            ThrowIfError(b.Set(epoch, std::move(flat), std::move(offsets), seed, std::move(blobs)));
          },
          py::arg("epoch"), py::arg("flat"), py::arg("offsets"), py::arg("seed"),
          py::arg("keys") = std::vector<py::bytes>{})
      .def("has", &EpochBatches::Has, py::arg("epoch"))
      .def("restart", &EpochBatches::Restart)
      .def("shutdown", &EpochBatches::Shutdown);

  py::class_<ProcessWorkers, std::shared_ptr<ProcessWorkers>>(m, "ProcessWorkers")
      .def(py::init<int, int, std::shared_ptr<EpochBatches>, bool>(), py::arg("zygote_fd"),
           py::arg("zygote_pid"), py::arg("batches"), py::arg("persistent"))
      .def("as_kind",
           [](const std::shared_ptr<ProcessWorkers>& w) {
             return KindHandle{std::make_shared<ProcessKind>(w)};
           })
      .def("view", &ViewOf, py::arg("descriptor"))
      .def(
          "part",
          [](const ProcessWorkers& w, int64_t epoch, int64_t item, int64_t part) -> py::object {
            std::optional<ProcessWorkers::Descriptor> got = w.PartOf(epoch, item, part);
            if (!got) return py::none();
            py::array_t<int64_t> descriptor(kDescriptorWords);
            std::copy(got->begin(), got->end(), descriptor.mutable_data());
            return descriptor;
          },
          py::arg("epoch"), py::arg("item"), py::arg("part"),
          "Part `part` of an item being made (ProcessWorkers::PartOf): its descriptor, or None "
          "while it is not published.")
      .def("view_part", &PartViewOf, py::arg("descriptor"),
           "view() of a published part: its segment stays out of the pool while the view lives.")
      .def("shutdown", &ProcessWorkers::Shutdown, py::call_guard<py::gil_scoped_release>())
      .def("close", &ProcessWorkers::Close, py::call_guard<py::gil_scoped_release>())
      .def("pin", [](ProcessWorkers& w) { ThrowIfError(w.Pin()); })
      .def_property_readonly("pinned_mappings", &ProcessWorkers::pinned_mappings)
      .def("pids", &ProcessWorkers::pids)
      .def("handed_over", &ProcessWorkers::handed_over)
      .def("shard_deaths", &ProcessWorkers::shard_deaths)
      .def("forgo", &ProcessWorkers::Forgo, py::arg("epoch"), py::arg("item"),
           "Lets go of a yielded item's continuation (ProcessWorkers::Forgo): it was made "
           "elsewhere from its start.")
      .def("segment_bytes", &ProcessWorkers::segment_bytes);
}

}  // namespace stoker::python
