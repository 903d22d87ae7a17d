#include "thread_workers.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "bindings.h"
#include "core/clock.h"
#include "engine/run_delay.h"
#include "errors.h"
#include "process_workers.h"

namespace stoker::python {

namespace py = pybind11;

namespace {

// Tickets are unique in the process, across every ThreadWorkers: a sample's
// error names its batch by ticket alone (SampleErrorDetail::batch_ticket).
std::atomic<uint64_t> g_next_ticket{1};

// The batch's pickled keys for run_batch (its indices are positions in
// them), or None: the indices are the keys. Under the GIL.
py::object KeysOf(const EpochBatches::Batch& got) {
  if (got.keys.empty()) return py::none();
  return py::bytes(got.keys);
}

}  // namespace

ThreadWorkers::ThreadWorkers(py::object run_batch, std::shared_ptr<EpochBatches> batches,
                             int64_t magic)
    : run_batch_(std::move(run_batch)), batches_(std::move(batches)), magic_(magic) {}

ThreadWorkers::~ThreadWorkers() {
  // No lock: no other thread holds this any more (a Python thread's Finish
  // reaches it through a weak_ptr).
  if (!Py_IsInitialized()) {  // the interpreter is gone: nothing left to drop
    (void)run_batch_.release();
    for (auto& [ticket, batch] : ready_) (void)batch.release();
    for (auto& batch : dead_) (void)batch.release();
    for (auto& lane : lanes_) {
      if (!lane) continue;
      (void)lane->inbox.release();
      (void)lane->made.result.release();
    }
    return;
  }
  py::gil_scoped_acquire gil;
  for (auto& lane : lanes_) {
    if (!lane || !lane->inbox) continue;
    try {
      lane->inbox.attr("put")(py::none());  // its thread ends once its batch is done
    } catch (py::error_already_set&) {      // nothing to tell from a destructor
    }
  }
  lanes_.clear();
  ready_.clear();
  dead_.clear();
  run_batch_ = py::object();
}

namespace {

// run_batch's (payload, info): info is (kept, failures, collate error,
// epoch, batch), each failure (index, reason, traceback, not the sample's
// fault, the exception), the collate error (reason, traceback, the
// pickled exception); None when the batch raised what next() re-raises; a
// str when a shard stopped, its payload None: at a part (_shards.YIELDED),
// or at a sample, its epoch abandoned (_workers.DROPPED, read by name).
constexpr int kInfo = 1, kFailures = 1, kCollateError = 2, kException = 4, kCollateException = 2;

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
  if (const py::object collate = parts[kCollateError]; !collate.is_none()) {
    const auto error = collate.cast<py::tuple>();
    auto detail = std::make_shared<SampleErrorDetail>();
    detail->worker = worker;
    detail->exception = error[kCollateException].cast<std::string>();
    return BatchFailureStatus(error[0].cast<std::string>(), error[1].cast<std::string>(),
                              std::move(detail));
  }
  return Status::Ok();
}

}  // namespace

ThreadWorkers::Made ThreadWorkers::Read(py::object result, uint64_t ticket, int worker) {
  Made made;
  try {
    if (result.is_none()) {
      made.gave_back = true;
      made.status = Unavailable("the batch was given back");
      return made;
    }
    const auto made_tuple = result.cast<py::tuple>();
    // A sharded stream's item stopped at a part: its batches so far stay in
    // the loader's table of parts, for the worker that continues it.
    if (py::isinstance<py::str>(made_tuple[kInfo])) {
      const bool dropped =
          py::object(made_tuple[kInfo])
              .equal(py::object(py::module_::import("stoker._workers").attr("DROPPED")));
      (dropped ? made.dropped : made.yielded) = true;
      return made;
    }
    made.status = ReadOutcome(made_tuple, ticket, worker, &made.outcome);
  } catch (py::error_already_set& e) {
    made.status = Internal(std::string("the batch failed in a worker thread: ") + e.what());
  } catch (const py::cast_error& e) {
    made.status = Internal(std::string("run_batch gave no (payload, info): ") + e.what());
  }
  if (made.status.ok()) made.result = std::move(result);
  return made;
}

Status ThreadWorkers::Deliver(Made made, uint64_t ticket, int64_t epoch, int64_t batch,
                              int64_t out[kThreadDescriptorWords], ItemOutcome* outcome,
                              bool* gave_back) {
  if (made.gave_back && gave_back != nullptr) *gave_back = true;
  if (made.yielded || made.dropped) {
    (made.dropped ? outcome->dropped : outcome->yielded) = true;
    return Status::Ok();
  }
  outcome->samples = made.outcome.samples;
  outcome->failures = std::move(made.outcome.failures);
  if (!made.status.ok()) return made.status;
  ready_.emplace(ticket, std::move(made.result));  // a move: no reference count touched
  using D = protocol::ThreadDescriptor;
  out[D::kMagic] = magic_;
  out[D::kTicket] = static_cast<int64_t>(ticket);
  out[D::kEpoch] = epoch;
  out[D::kBatch] = batch;
  return Status::Ok();
}

Status ThreadWorkers::Run(int64_t epoch, int64_t batch, int worker,
                          int64_t out[kThreadDescriptorWords], ItemOutcome* outcome,
                          bool* gave_back) {
  STOKER_ASSIGN_OR_RETURN(EpochBatches::Batch got, batches_->Get(epoch, batch));
  // Before the batch runs: its failures name it.
  const uint64_t ticket = g_next_ticket.fetch_add(1, std::memory_order_relaxed);
  if (worker < 0) {  // the consumer's thread: nobody else could wait on it
    py::gil_scoped_acquire gil;
    Made made;
    try {
      made = Read(run_batch_(epoch, batch, py::cast(got.indices), got.seed, KeysOf(got)), ticket,
                  worker);
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_Exception)) {
        // Ctrl-C (or SystemExit) in the user's code: the batch goes back to
        // be made again, and the error stays set for next() to raise.
        e.restore();
        outcome->interrupted = true;
        return Status::Ok();
      }
      made.status = Internal(std::string("the batch failed in a worker thread: ") + e.what());
    }
    MutexLock lock(mu_);
    return Deliver(std::move(made), ticket, epoch, batch, out, outcome, gave_back);
  }
  // The user's code runs on the worker's Python thread, not here, so that
  // Cancel can end this wait (and the engine join this thread) while a
  // batch hangs.
  STOKER_ASSIGN_OR_RETURN(const uint64_t sent, Send(worker, ticket, epoch, batch, got));
  MutexLock lock(mu_);
  Lane& lane = *lanes_[static_cast<size_t>(worker)];
  // A shard's item may stop at a part once this thread may leave the pool,
  // and at its next sample once its epoch is abandoned (at its first, for
  // one handed over just as that happened): asked every kYieldPoll.
  bool may_yield = outcome->may_leave != nullptr && batches_->sharded();
  bool may_drop = outcome->abandoned != nullptr && batches_->sharded();
  while (lane.done != sent && !cancelled_) {
    if (may_drop && outcome->Abandoned()) {
      lane.drop = sent;
      may_drop = false;
    }
    if (!may_yield && !may_drop) {
      answered_.Wait(mu_);
      continue;
    }
    answered_.WaitUntil(mu_, std::chrono::steady_clock::now() + kYieldPoll);
    if (lane.done == sent || !may_yield) continue;
    bool leave;
    {
      MutexUnlock unlock(mu_);  // may_leave takes the engine's lock
      leave = (*outcome->may_leave)();
    }
    if (leave) {
      lane.yield = sent;
      may_yield = false;
    }
  }
  if (lane.done != sent) {
    return Cancelled("the loader closed while batch " + std::to_string(batch) + " of epoch " +
                     std::to_string(epoch) + " ran");
  }
  return Deliver(std::move(lane.made), ticket, epoch, batch, out, outcome, gave_back);
}

Result<uint64_t> ThreadWorkers::Send(int worker, uint64_t ticket, int64_t epoch, int64_t batch,
                                     const EpochBatches::Batch& got) {
  py::gil_scoped_acquire gil;
  try {
    const py::object inbox = Inbox(worker);
    uint64_t sent;
    {
      MutexLock lock(mu_);
      if (cancelled_ || !inbox) return Cancelled("the loader closed");
      Lane& lane = *lanes_[static_cast<size_t>(worker)];
      sent = ++lane.sent;
      lane.ticket = ticket;
    }
    inbox.attr("put")(py::make_tuple(
        sent, py::make_tuple(epoch, batch, py::cast(got.indices), got.seed, KeysOf(got))));
    return sent;
  } catch (py::error_already_set& e) {
    return Internal(std::string("a worker thread could not be handed its batch: ") + e.what());
  }
}

py::object ThreadWorkers::Inbox(int worker) {
  {
    MutexLock lock(mu_);
    if (cancelled_) return py::object();  // Close may have ended the threads: none started
    const auto at = static_cast<size_t>(worker);
    if (lanes_.size() <= at) lanes_.resize(at + 1);
    if (!lanes_[at]) lanes_[at] = std::make_unique<Lane>();
    if (lanes_[at]->inbox) return lanes_[at]->inbox;
  }
  // Only the engine thread holding `worker` comes here: no other starts it.
  py::object inbox = py::module_::import("queue").attr("SimpleQueue")();
  // Weak: the thread outlives Cancel, and must not keep the loader's state.
  const py::cpp_function finish(
      [weak = weak_from_this()](int w, uint64_t sent, py::object result, py::object error) {
        if (const auto self = weak.lock()) {
          self->Finish(w, sent, std::move(result), std::move(error));
        }
      });
  const py::cpp_function cancelled([weak = weak_from_this()] {
    const auto self = weak.lock();
    return self == nullptr || self->cancelled();
  });
  const py::cpp_function yield_asked([weak = weak_from_this(), worker](uint64_t sent) {
    const auto self = weak.lock();
    return self != nullptr && self->yield_asked(worker, sent);
  });
  const py::cpp_function drop_asked([weak = weak_from_this(), worker](uint64_t sent) {
    const auto self = weak.lock();
    return self != nullptr && self->drop_asked(worker, sent);
  });
  // A daemon thread, never joined: a batch that hangs holds up neither
  // close() nor the interpreter's exit (stoker._workers.wait_for_thread_batches).
  const char* what = magic_ == protocol::kRemoteMagic ? "remote-slot" : "thread-worker";
  py::module_::import("threading")
      .attr("Thread")(
          py::arg("target") = py::module_::import("stoker._workers").attr("serve_thread_worker"),
          py::arg("args") =
              py::make_tuple(inbox, finish, cancelled, run_batch_, worker, yield_asked, drop_asked),
          py::arg("name") = "stoker-" + std::string(what) + "-" + std::to_string(worker),
          py::arg("daemon") = true)
      .attr("start")();
  MutexLock lock(mu_);
  lanes_[static_cast<size_t>(worker)]->inbox = inbox;
  return inbox;
}

bool ThreadWorkers::yield_asked(int worker, uint64_t sent) const {
  MutexLock lock(mu_);
  const auto at = static_cast<size_t>(worker);
  return at < lanes_.size() && lanes_[at] && lanes_[at]->yield == sent;
}

bool ThreadWorkers::drop_asked(int worker, uint64_t sent) const {
  MutexLock lock(mu_);
  const auto at = static_cast<size_t>(worker);
  return at < lanes_.size() && lanes_[at] && lanes_[at]->drop == sent;
}

void ThreadWorkers::Finish(int worker, uint64_t sent, py::object result, py::object error) {
  // On the Python thread itself: its own clocks, which the engine's thread cannot read.
  thread_local const RunDelayClock run_delay;
  const int64_t cpu_ns = ThreadCpuNanos();
  const int64_t queue_ns = std::max<int64_t>(run_delay.ReadNanos(), 0);
  uint64_t ticket;
  {
    MutexLock lock(mu_);
    const Lane& lane = *lanes_.at(static_cast<size_t>(worker));
    if (cancelled_ || lane.sent != sent) return;  // nobody waits: dropped here, with the GIL
    ticket = lane.ticket;
  }
  Made made;
  if (error.is_none()) {
    made = Read(std::move(result), ticket, worker);
  } else {
    made.status =
        Internal("the batch failed in a worker thread: " + py::str(error).cast<std::string>());
  }
  {
    MutexLock lock(mu_);
    Lane& lane = *lanes_[static_cast<size_t>(worker)];
    if (!cancelled_ && lane.sent == sent) {
      lane.made = std::move(made);
      lane.done = sent;
      lane.cpu_ns = cpu_ns;
      lane.queue_ns = queue_ns;
      answered_.NotifyAll();
      return;
    }
  }
  // Cancelled meanwhile: `made` is dropped here, with the GIL.
}

WorkerCost ThreadWorkers::Cost(int worker) const {
  MutexLock lock(mu_);
  const auto at = static_cast<size_t>(worker);
  if (at >= lanes_.size() || !lanes_[at]) return {};
  return {.thread_cpu_ns = lanes_[at]->cpu_ns, .queue_ns = lanes_[at]->queue_ns};
}

bool ThreadWorkers::cancelled() const {
  MutexLock lock(mu_);
  return cancelled_;
}

void ThreadWorkers::Cancel() {
  {
    MutexLock lock(mu_);
    cancelled_ = true;
  }
  answered_.NotifyAll();
  batches_->Shutdown();
}

void ThreadWorkers::Close() {
  Cancel();
  std::vector<py::object> inboxes;
  {
    MutexLock lock(mu_);
    for (auto& lane : lanes_) {
      if (lane && lane->inbox) inboxes.push_back(std::move(lane->inbox));
    }
  }
  for (const auto& inbox : inboxes) inbox.attr("put")(py::none());
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
    Status st = workers_->Run(epoch, item, id_, descriptor, outcome);
    workers_->batches().NameShardFailures(&outcome->failures);
    STOKER_RETURN_IF_ERROR(st);
    std::memcpy(out.data(), descriptor, sizeof descriptor);
    outcome->label = item;
    return Status::Ok();
  }
  WorkerCost cost() const override { return id_ >= 0 ? workers_->Cost(id_) : WorkerCost{}; }

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
      .def("close", &ThreadWorkers::Close,
           "Stops handing out batches; each worker's Python thread ends once its batch is done "
           "(the engine stopped first). Idempotent.")
      .def("failure_cause", &ThreadWorkers::FailureCause, py::arg("ticket"), py::arg("failure"),
           "The exception of a failed sample (a DataError's SampleErrorDetail), while its "
           "batch is not taken; else None.");
}

}  // namespace stoker::python
