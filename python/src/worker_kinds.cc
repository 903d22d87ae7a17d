#include "worker_kinds.h"

#include <algorithm>
#include <string>

#include "bindings.h"
#include "errors.h"

namespace stoker::python {

namespace py = pybind11;

namespace {

// An engine thread's worker: the process kind's (its process forked as the
// process kind forks it) and the thread kind's (a Python thread of its own),
// whose figures it passes on.
class EitherWorker : public KindWorker {
 public:
  EitherWorker(WorkerKinds& kinds, const ThreadKind& thread_kind,
               std::unique_ptr<KindWorker> thread, std::unique_ptr<KindWorker> process)
      : kinds_(kinds),
        thread_kind_(thread_kind),
        thread_(std::move(thread)),
        process_(std::move(process)) {}

  Status Run(int64_t epoch, int64_t item, std::span<std::byte> out, ItemOutcome* outcome) override {
    if (kinds_.kind() == KindChoice::kProcesses) return process_->Run(epoch, item, out, outcome);
    if (kinds_.retire_processes()) static_cast<ProcessWorker*>(process_.get())->Stop();
    std::fill(out.begin(), out.end(), std::byte{0});
    const ItemOutcome asked = *outcome;
    Status status = thread_->Run(epoch, item, out, outcome);
    const bool failed = status.ok() ? !outcome->failures.empty()
                                    : status.code() == StatusCode::kDataError;  // collate_fn's
    if (kinds_.retire_processes() || outcome->yielded || !failed) return status;
    // Failed on threads before threads were chosen: the dataset may work only
    // in processes (a handle bound to the thread that made it). Processes for
    // good, and this batch made again there, so the trial costs no sample.
    std::string why = status.message();
    if (status.ok()) {
      const SampleFailure& f = outcome->failures.front();
      why = (!f.name.empty() ? f.name
             : f.key.empty() ? "sample " + std::to_string(f.index)
                             : f.key) +
            ": " + f.status.message();
    }
    kinds_.ThreadsFailed(why);
    if (!kinds_.remake_failed()) return status;
    if (status.ok()) thread_kind_.Recycle(out);
    std::fill(out.begin(), out.end(), std::byte{0});
    *outcome = asked;
    return process_->Run(epoch, item, out, outcome);
  }
  WorkerCost cost() const override {
    WorkerCost cost = process_->cost();
    const WorkerCost thread = thread_->cost();
    cost.thread_cpu_ns += thread.thread_cpu_ns;
    cost.queue_ns += thread.queue_ns;
    return cost;
  }

 private:
  WorkerKinds& kinds_;
  const ThreadKind& thread_kind_;
  std::unique_ptr<KindWorker> thread_;
  std::unique_ptr<KindWorker> process_;
};

}  // namespace

EitherKind::EitherKind(std::shared_ptr<WorkerKinds> kinds)
    : kinds_(std::move(kinds)), process_(kinds_->processes()), thread_(kinds_->threads()) {}

std::unique_ptr<KindWorker> EitherKind::NewWorker(WorkerPlace place, const SampleCap& cap) const {
  // Once threads are chosen, a new engine thread forks no process.
  const WorkerPlace forks = kinds_->retire_processes() ? WorkerPlace::kConsumer : place;
  return std::make_unique<EitherWorker>(*kinds_, thread_, thread_.NewWorker(place, cap),
                                        process_.NewWorker(forks, cap));
}

void EitherKind::Resized(int workers, int remote) const {
  process_.Resized(workers, remote);
  thread_.Resized(workers, remote);
}

void EitherKind::Cancel() const {
  process_.Cancel();
  thread_.Cancel();
}

void EitherKind::Recycle(std::span<std::byte> out) const {
  process_.Recycle(out);  // each acts only on its own kind's magic
  thread_.Recycle(out);
}

void BindWorkerKinds(py::module_& m) {
  py::class_<WorkerKinds, std::shared_ptr<WorkerKinds>>(m, "WorkerKinds")
      .def(py::init<std::shared_ptr<ProcessWorkers>, std::shared_ptr<ThreadWorkers>, bool>(),
           py::arg("processes"), py::arg("threads"), py::arg("remake_failed"))
      .def_property_readonly("threads_failed", &WorkerKinds::threads_failed)
      .def_property_readonly("remake_failed", &WorkerKinds::remake_failed)
      .def("as_kind",
           [](const std::shared_ptr<WorkerKinds>& k) {
             return KindHandle{std::make_shared<EitherKind>(k)};
           })
      .def(
          "set",
          [](WorkerKinds& k, const std::string& kind, bool final) {
            if (kind != "processes" && kind != "threads") {
              throw py::value_error("worker kind must be 'processes' or 'threads', got '" + kind +
                                    "'");
            }
            k.Set(kind == "threads" ? KindChoice::kThreads : KindChoice::kProcesses, final);
          },
          py::arg("kind"), py::arg("final") = false)
      .def_property_readonly("kind", [](const WorkerKinds& k) {
        return k.kind() == KindChoice::kThreads ? "threads" : "processes";
      });
}

}  // namespace stoker::python
