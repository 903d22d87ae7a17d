#include "thread_workers.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "bindings.h"
#include "errors.h"
#include "process_workers.h"

namespace stoker::python {

namespace py = pybind11;

namespace {

// Tickets are unique in the process, across every ThreadWorkers: a sample's
// error names its batch by ticket alone (SampleErrorDetail::batch_ticket).
std::atomic<uint64_t> g_next_ticket{1};

}  // namespace

ThreadWorkers::ThreadWorkers(py::object run_batch, std::shared_ptr<EpochBatches> batches,
                             int64_t magic)
    : run_batch_(std::move(run_batch)), batches_(std::move(batches)), magic_(magic) {}

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

namespace {

// run_batch's (payload, info): info is (kept, failures, collate error,
// epoch, batch), each failure (index, reason, traceback, not the sample's
// fault, the exception); None when the batch raised what next() re-raises.
constexpr int kInfo = 1, kFailures = 1, kException = 4;

// The failures in the batch `made` (ThreadWorkers ticket `ticket`) by `worker`.
Status ReadOutcome(const py::tuple& made, uint64_t ticket, int worker, ItemOutcome* outcome) {
  const py::object info = made[kInfo];
  if (info.is_none()) return Status::Ok();
  const auto parts = info.cast<py::tuple>();
  outcome->samples = static_cast<int64_t>(py::len(parts[0]));
  int64_t position = 0;
  for (const py::handle f : parts[kFailures]) {
    const auto failure = f.cast<py::tuple>();
    auto detail = std::make_shared<SampleErrorDetail>();
    detail->index = failure[0].cast<int64_t>();
    detail->worker = worker;
    detail->traceback = failure[2].cast<std::string>();
    detail->batch_ticket = ticket;
    detail->failure = position++;
    outcome->failures.push_back(
        FailedSample(std::move(detail), failure[1].cast<std::string>(), failure[3].cast<bool>()));
  }
  if (const py::object collate = parts[2]; !collate.is_none()) {
    const auto error = collate.cast<py::tuple>();
    return BatchFailureStatus(error[0].cast<std::string>(), error[1].cast<std::string>());
  }
  return Status::Ok();
}

}  // namespace

Status ThreadWorkers::Run(int64_t epoch, int64_t batch, int worker,
                          int64_t out[kThreadDescriptorWords], ItemOutcome* outcome,
                          bool* gave_back) {
  STOKER_ASSIGN_OR_RETURN(EpochBatches::Batch got, batches_->Get(epoch, batch));
  // Before the batch runs: its failures name it.
  const uint64_t ticket = g_next_ticket.fetch_add(1, std::memory_order_relaxed);
  py::gil_scoped_acquire gil;
  py::object made;
  try {
    made = run_batch_(epoch, batch, py::cast(got.indices), got.seed);
    if (made.is_none()) {
      if (gave_back != nullptr) *gave_back = true;
      return Unavailable("the batch was given back");
    }
    STOKER_RETURN_IF_ERROR(ReadOutcome(made.cast<py::tuple>(), ticket, worker, outcome));
  } catch (py::error_already_set& e) {
    return Internal(std::string("the batch failed in a worker thread: ") + e.what());
  } catch (const py::cast_error& e) {
    return Internal(std::string("run_batch gave no (payload, info): ") + e.what());
  }
  MutexLock lock(mu_);
  ready_.emplace(ticket, std::move(made));
  using D = protocol::ThreadDescriptor;
  out[D::kMagic] = magic_;
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

py::object ThreadWorkers::FailureCause(uint64_t ticket, int64_t failure) {
  py::object made;
  {
    MutexLock lock(mu_);
    if (auto it = ready_.find(ticket); it != ready_.end()) made = it->second;
  }
  if (!made) return py::none();
  try {
    const auto info = made.cast<py::tuple>()[kInfo].cast<py::tuple>();
    const auto failures = info[kFailures].cast<py::sequence>();
    return failures[static_cast<size_t>(failure)].cast<py::tuple>()[kException];
  } catch (py::error_already_set&) {
    return py::none();
  } catch (const py::cast_error&) {
    return py::none();
  }
}

int ThreadWorkers::AcquireWorkerId() {
  MutexLock lock(mu_);
  const auto free = std::find(ids_in_use_.begin(), ids_in_use_.end(), false);
  const auto id = static_cast<int>(free - ids_in_use_.begin());
  if (free == ids_in_use_.end()) ids_in_use_.push_back(false);
  ids_in_use_[static_cast<size_t>(id)] = true;
  return id;
}

void ThreadWorkers::ReleaseWorkerId(int id) {
  MutexLock lock(mu_);
  ids_in_use_[static_cast<size_t>(id)] = false;
}

namespace {

// Runs items on its thread (an engine worker thread, with a worker id of
// its own, or the consumer's).
class ThreadWorker : public KindWorker {
 public:
  ThreadWorker(std::shared_ptr<ThreadWorkers> workers, WorkerPlace place)
      : workers_(std::move(workers)),
        id_(place == WorkerPlace::kWorkerThread ? workers_->AcquireWorkerId() : -1) {}
  ~ThreadWorker() override {
    if (id_ >= 0) workers_->ReleaseWorkerId(id_);
  }
  Status Run(int64_t epoch, int64_t item, std::span<std::byte> out, ItemOutcome* outcome) override {
    int64_t descriptor[kThreadDescriptorWords];
    STOKER_RETURN_IF_ERROR(workers_->Run(epoch, item, id_, descriptor, outcome));
    std::memcpy(out.data(), descriptor, sizeof descriptor);
    outcome->label = item;
    return Status::Ok();
  }

 private:
  const std::shared_ptr<ThreadWorkers> workers_;
  const int id_;
};

}  // namespace

int64_t ThreadKind::items() const { return workers_->first_batches(); }

std::unique_ptr<KindWorker> ThreadKind::NewWorker(WorkerPlace place, const SampleCap&) const {
  return std::make_unique<ThreadWorker>(workers_, place);
}

void ThreadKind::Cancel() const { workers_->Cancel(); }

void ThreadKind::Recycle(std::span<std::byte> out) const {
  int64_t d[kThreadDescriptorWords];
  std::memcpy(d, out.data(), sizeof d);
  using D = protocol::ThreadDescriptor;
  if (d[D::kMagic] == workers_->magic()) workers_->Recycle(static_cast<uint64_t>(d[D::kTicket]));
}

void BindThreadWorkers(py::module_& m) {
  py::class_<ThreadWorkers, std::shared_ptr<ThreadWorkers>>(m, "ThreadWorkers")
      .def(py::init([](py::object run_batch, std::shared_ptr<EpochBatches> batches, bool remote) {
             return std::make_shared<ThreadWorkers>(
                 std::move(run_batch), std::move(batches),
                 remote ? protocol::kRemoteMagic : protocol::kThreadMagic);
           }),
           py::arg("run_batch"), py::arg("batches"), py::arg("remote") = false,
           "remote=True: the remote slots' batches (descriptors marked REMOTE_MAGIC).")
      .def("as_kind",
           [](const std::shared_ptr<ThreadWorkers>& w) {
             return KindHandle{std::make_shared<ThreadKind>(w)};
           })
      .def(
          "take",
          [](ThreadWorkers& w, py::array_t<int64_t> descriptor) {
            using D = protocol::ThreadDescriptor;
            if (descriptor.size() < kThreadDescriptorWords ||
                descriptor.data()[D::kMagic] != w.magic()) {
              throw py::value_error("not a thread batch descriptor");
            }
            return w.Take(static_cast<uint64_t>(descriptor.data()[D::kTicket]));
          },
          py::arg("descriptor"))
      .def("failure_cause", &ThreadWorkers::FailureCause, py::arg("ticket"), py::arg("failure"),
           "The exception of a failed sample (a DataError's SampleErrorDetail), while its "
           "batch is not taken; else None.");
}

}  // namespace stoker::python
