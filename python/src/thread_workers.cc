#include "thread_workers.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <string>

#include "bindings.h"
#include "errors.h"
#include "process_workers.h"

namespace stoker::python {

namespace py = pybind11;

ThreadWorkers::ThreadWorkers(py::object run_batch, uint64_t seed,
                             std::shared_ptr<EpochBatches> batches)
    : run_batch_(std::move(run_batch)), seed_(seed), batches_(std::move(batches)) {}

ThreadWorkers::~ThreadWorkers() {
  if (!Py_IsInitialized()) {  // the interpreter is gone: nothing left to drop
    (void)run_batch_.release();
    for (auto& [ticket, batch] : ready_) (void)batch.release();
    for (auto& batch : dead_) (void)batch.release();
    return;
  }
  py::gil_scoped_acquire gil;
  ready_.clear();
  dead_.clear();
  run_batch_ = py::object();
}

Status ThreadWorkers::Run(int64_t epoch, int64_t batch, int64_t out[kThreadDescriptorWords]) {
  STOKER_ASSIGN_OR_RETURN(std::vector<int64_t> indices, batches_->Indices(epoch, batch));
  const int64_t seed = BatchSeed(seed_, epoch, batch);
  py::gil_scoped_acquire gil;
  py::object made;
  try {
    made = run_batch_(epoch, batch, py::cast(indices), seed);
  } catch (py::error_already_set& e) {
    return Internal(std::string("the batch failed in a worker thread: ") + e.what());
  }
  MutexLock lock(mu_);
  const uint64_t ticket = next_ticket_++;
  ready_.emplace(ticket, std::move(made));
  using D = protocol::ThreadDescriptor;
  out[D::kMagic] = protocol::kThreadMagic;
  out[D::kTicket] = static_cast<int64_t>(ticket);
  out[D::kEpoch] = epoch;
  out[D::kBatch] = batch;
  return Status::Ok();
}

void ThreadWorkers::Recycle(uint64_t ticket) {
  MutexLock lock(mu_);
  auto it = ready_.find(ticket);
  if (it == ready_.end()) return;          // taken already
  dead_.push_back(std::move(it->second));  // a move: no reference count touched
  ready_.erase(it);
}

py::object ThreadWorkers::Take(uint64_t ticket) {
  py::object taken;
  std::vector<py::object> dead;
  {
    MutexLock lock(mu_);
    auto it = ready_.find(ticket);
    if (it != ready_.end()) {
      taken = std::move(it->second);
      ready_.erase(it);
    }
    dead.swap(dead_);
  }
  if (!taken) throw py::value_error("a stale batch ticket " + std::to_string(ticket));
  return taken;  // `dead` is dropped here, with the GIL held
}

Status ThreadTransform::Apply(const Record& record, SampleRng& /*rng*/, std::span<std::byte> out,
                              TransformScratch* /*scratch*/) const {
  int64_t descriptor[kThreadDescriptorWords];
  STOKER_RETURN_IF_ERROR(workers_->Run(record.epoch, record.label, descriptor));
  std::memcpy(out.data(), descriptor, sizeof descriptor);
  return Status::Ok();
}

void ThreadTransform::Recycle(std::span<std::byte> out) const {
  int64_t d[kThreadDescriptorWords];
  std::memcpy(d, out.data(), sizeof d);
  using D = protocol::ThreadDescriptor;
  if (d[D::kMagic] == protocol::kThreadMagic)
    workers_->Recycle(static_cast<uint64_t>(d[D::kTicket]));
}

void BindThreadWorkers(py::module_& m) {
  py::class_<ThreadWorkers, std::shared_ptr<ThreadWorkers>>(m, "ThreadWorkers")
      .def(py::init<py::object, uint64_t, std::shared_ptr<EpochBatches>>(), py::arg("run_batch"),
           py::arg("seed"), py::arg("batches"))
      .def("transform",
           [](const std::shared_ptr<ThreadWorkers>& w) {
             return TransformHandle{std::make_shared<ThreadTransform>(w), "python dataset"};
           })
      .def(
          "take",
          [](ThreadWorkers& w, py::array_t<int64_t> descriptor) {
            using D = protocol::ThreadDescriptor;
            if (descriptor.size() < kThreadDescriptorWords ||
                descriptor.data()[D::kMagic] != protocol::kThreadMagic) {
              throw py::value_error("not a thread batch descriptor");
            }
            return w.Take(static_cast<uint64_t>(descriptor.data()[D::kTicket]));
          },
          py::arg("descriptor"));
}

}  // namespace stoker::python
