#include "worker_kinds.h"

#include <algorithm>
#include <string>

#include "bindings.h"
#include "errors.h"

namespace stoker::python {

namespace py = pybind11;

namespace {

// An engine thread's scratch: the process kind's (its worker process, made
// on its first process task), whose figures it passes on.
class EitherScratch : public TransformScratch {
 public:
  explicit EitherScratch(std::unique_ptr<TransformScratch> process)
      : process_(std::move(process)) {}
  size_t bytes() const override { return process_->bytes(); }
  size_t trimmable_bytes() const override { return process_->trimmable_bytes(); }
  int64_t cpu_ns_elsewhere() const override { return process_->cpu_ns_elsewhere(); }
  int64_t queue_ns_elsewhere() const override { return process_->queue_ns_elsewhere(); }
  TransformScratch* process() { return process_.get(); }

 private:
  std::unique_ptr<TransformScratch> process_;
};

}  // namespace

EitherKindTransform::EitherKindTransform(std::shared_ptr<WorkerKinds> kinds)
    : kinds_(std::move(kinds)), process_(kinds_->processes()), thread_(kinds_->threads()) {}

std::unique_ptr<TransformScratch> EitherKindTransform::NewScratch() const {
  return std::make_unique<EitherScratch>(process_.NewScratch());
}

std::unique_ptr<TransformScratch> EitherKindTransform::NewWorkerScratch() const {
  // Once threads are chosen, a new engine thread forks no process.
  return std::make_unique<EitherScratch>(kinds_->retire_processes() ? process_.NewScratch()
                                                                    : process_.NewWorkerScratch());
}

Status EitherKindTransform::Apply(const Record& record, SampleRng& rng, std::span<std::byte> out,
                                  TransformScratch* scratch) const {
  if (scratch == nullptr) return Internal("worker_kind='auto' needs a worker thread's scratch");
  auto* either = static_cast<EitherScratch*>(scratch);
  if (kinds_->kind() == WorkerKind::kProcesses) {
    return process_.Apply(record, rng, out, either->process());
  }
  if (kinds_->retire_processes()) ProcessTransform::StopProcess(either->process());
  std::fill(out.begin(), out.end(), std::byte{0});
  return thread_.Apply(record, rng, out, nullptr);
}

void EitherKindTransform::Recycle(std::span<std::byte> out) const {
  process_.Recycle(out);  // each acts only on its own kind's magic
  thread_.Recycle(out);
}

void BindWorkerKinds(py::module_& m) {
  py::class_<WorkerKinds, std::shared_ptr<WorkerKinds>>(m, "WorkerKinds")
      .def(py::init<std::shared_ptr<ProcessWorkers>, std::shared_ptr<ThreadWorkers>>(),
           py::arg("processes"), py::arg("threads"))
      .def("transform",
           [](const std::shared_ptr<WorkerKinds>& k) {
             return TransformHandle{std::make_shared<EitherKindTransform>(k), "python dataset"};
           })
      .def(
          "set",
          [](WorkerKinds& k, const std::string& kind, bool final) {
            if (kind != "processes" && kind != "threads") {
              throw py::value_error("worker kind must be 'processes' or 'threads', got '" + kind +
                                    "'");
            }
            k.Set(kind == "threads" ? WorkerKind::kThreads : WorkerKind::kProcesses, final);
          },
          py::arg("kind"), py::arg("final") = false)
      .def_property_readonly("kind", [](const WorkerKinds& k) {
        return k.kind() == WorkerKind::kThreads ? "threads" : "processes";
      });
}

}  // namespace stoker::python
