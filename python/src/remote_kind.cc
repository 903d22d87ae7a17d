#include "remote_kind.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "bindings.h"

namespace stoker::python {

namespace py = pybind11;

namespace {

// An engine thread's worker: the local kind's, started before its first
// batch only while local places lack a started worker, and a remote slot's.
class LocalFirstWorker : public KindWorker {
 public:
  LocalFirstWorker(std::unique_ptr<KindWorker> local, std::shared_ptr<ThreadWorkers> remote,
                   std::shared_ptr<RemoteSlots> slots, WorkerPlace place)
      : local_(std::move(local)),
        remote_(std::move(remote)),
        slots_(std::move(slots)),
        sends_(place == WorkerPlace::kWorkerThread),
        id_(sends_ ? remote_->AcquireWorkerId() : -1) {}
  ~LocalFirstWorker() override {
    if (claimed_) slots_->ReleaseLocal();
    if (id_ >= 0) remote_->ReleaseWorkerId(id_);
  }

  Status Ready() override {
    claimed_ = slots_->ClaimLocal();
    return claimed_ ? local_->Ready() : Status::Ok();
  }

  Status Run(int64_t epoch, int64_t item, std::span<std::byte> out, ItemOutcome* outcome) override {
    // The consumer's thread (no workers) never sends: it would only wait.
    if (!sends_) return local_->Run(epoch, item, out, outcome);
    was_remote_ = slots_->Take(was_remote_);
    if (!was_remote_) {
      Status st = local_->Run(epoch, item, out, outcome);
      slots_->Done(false);
      return st;
    }
    std::fill(out.begin(), out.end(), std::byte{0});
    int64_t descriptor[kThreadDescriptorWords];
    bool gave_back = false;
    Status st = remote_->Run(epoch, item, id_, descriptor, outcome, &gave_back);
    slots_->Done(true);
    if (!gave_back) {
      if (st.ok()) std::memcpy(out.data(), descriptor, sizeof descriptor);
      outcome->label = item;
      outcome->remote = st.ok();
      return st;
    }
    // The cluster could not make it, or it lagged: made here, as if never
    // sent. A slot's thread is none of the tuner's local workers: its time
    // stays out of their figures (it would read as a local worker waiting).
    was_remote_ = false;
    outcome->failures.clear();
    outcome->samples = 1;
    st = local_->Run(epoch, item, out, outcome);
    outcome->remote = true;
    return st;
  }

  WorkerCost cost() const override { return local_->cost(); }

 private:
  std::unique_ptr<KindWorker> local_;
  const std::shared_ptr<ThreadWorkers> remote_;
  const std::shared_ptr<RemoteSlots> slots_;
  const bool sends_;  // an engine worker thread, which may be a remote slot
  const int id_;      // its worker id among the remote slots' threads
  bool claimed_ = false;
  bool was_remote_ = false;
};

}  // namespace

LocalFirstKind::LocalFirstKind(std::shared_ptr<const WorkerKind> local,
                               std::shared_ptr<ThreadWorkers> remote,
                               std::shared_ptr<RemoteSlots> slots)
    : local_(std::move(local)), remote_(std::move(remote)), slots_(std::move(slots)) {
  assert(local_->spec().bytes() >= remote_.spec().bytes());
}

std::unique_ptr<KindWorker> LocalFirstKind::NewWorker(WorkerPlace place,
                                                      const SampleCap& cap) const {
  return std::make_unique<LocalFirstWorker>(local_->NewWorker(place, cap), remote_.workers(),
                                            slots_, place);
}

void LocalFirstKind::Resized(int workers, int remote) const {
  slots_->Resized(workers, remote);
  local_->Resized(workers - remote, 0);
}

void LocalFirstKind::Cancel() const {
  local_->Cancel();
  remote_.Cancel();
}

void LocalFirstKind::Recycle(std::span<std::byte> out) const {
  if (local_->recycles()) local_->Recycle(out);  // each acts only on its own magic
  remote_.Recycle(out);
}

void BindRemoteSlots(py::module_& m) {
  py::class_<RemoteSlots, std::shared_ptr<RemoteSlots>>(m, "RemoteSlots")
      .def(py::init<>())
      .def_property("capacity", &RemoteSlots::capacity, &RemoteSlots::set_capacity,
                    "Slots the cluster offers now, as the loader last saw it.")
      .def_property("task_bytes", &RemoteSlots::task_bytes, &RemoteSlots::set_task_bytes,
                    "Bytes one remote task brought back lately (the tuner's memory budget).")
      .def_property_readonly("target", &RemoteSlots::remote_target,
                             "Remote slots the engine keeps now (the tuner's).")
      .def_property_readonly("busy", &RemoteSlots::remote_busy, "Batches on the cluster now.")
      .def_property_readonly("peak", &RemoteSlots::peak,
                             "Most batches on the cluster at once, in the loader's life.");
  m.def(
      "local_first",
      [](const KindHandle& local, std::shared_ptr<ThreadWorkers> remote,
         std::shared_ptr<RemoteSlots> slots) {
        if (remote->magic() != protocol::kRemoteMagic) {
          throw py::value_error("the remote slots' ThreadWorkers must be made with remote=True");
        }
        // A remote batch's descriptor is written into the local kind's output.
        if (local.kind->spec().bytes() < ThreadKind(remote).spec().bytes()) {
          throw py::value_error("the local kind's output cannot hold a remote batch's descriptor");
        }
        return KindHandle{
            std::make_shared<LocalFirstKind>(local.kind, std::move(remote), std::move(slots))};
      },
      py::arg("local"), py::arg("remote"), py::arg("slots"),
      "The local kind beside remote slots whose batches `remote` sends to a cluster.");
}

}  // namespace stoker::python
