#include "remote_sample_kind.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"
#include "engine/sample_kind.h"

namespace stoker::python {

namespace py = pybind11;

namespace {

// One failed sample of a remote task, as it travels: its position in the
// task, its StatusCode and its message (the engine adds the key).
using WireFailure = std::tuple<int64_t, int, std::string>;

Status FromWire(int code, const std::string& message) {
  if (code <= static_cast<int>(StatusCode::kOk) || code > static_cast<int>(StatusCode::kInternal)) {
    return Internal("a remote sample failed with an unknown status " + std::to_string(code) + ": " +
                    message);
  }
  return Status(static_cast<StatusCode>(code), message);
}

// A task's samples as they came back from the cluster, copied out of Python.
struct RemoteTask {
  int64_t epoch = 0;
  std::vector<int64_t> items;
  std::vector<std::byte> samples;  // items.size() samples, back to back
  std::vector<int64_t> labels;
  std::vector<std::optional<Status>> failures;  // by position
  size_t next = 0;                              // the position Run takes next
};

// An engine thread's worker: the engine's own (a SampleWorker) for local
// tasks; a remote slot's tasks go to the cluster whole.
class LocalFirstSampleWorker : public KindWorker {
 public:
  LocalFirstSampleWorker(std::unique_ptr<KindWorker> local, std::shared_ptr<py::object> send,
                         std::shared_ptr<RemoteSlots> slots, WorkerPlace place, size_t sample_bytes,
                         const SampleCap& cap)
      : local_(std::move(local)),
        send_(std::move(send)),
        slots_(std::move(slots)),
        sends_(place == WorkerPlace::kWorkerThread),
        sample_bytes_(sample_bytes),
        cap_(cap) {}
  ~LocalFirstSampleWorker() override { Settle(); }

  // The consumer's thread (no workers) never sends: it would only wait.
  bool expects() const override { return sends_; }

  void Expect(int64_t epoch, std::span<const int64_t> items) override {
    Settle();
    was_remote_ = slots_->Take(was_remote_);
    taken_ = true;
    given_back_ = false;
    if (!was_remote_) return;  // made here; Done when the next task comes
    task_ = Send(epoch, items);
    slots_->Done(true);
    taken_ = false;
    if (!task_) {  // given back: made here, as if never sent
      was_remote_ = false;
      given_back_ = true;
    }
  }

  Status Run(int64_t epoch, int64_t item, std::span<std::byte> out, ItemOutcome* outcome) override {
    if (!task_ || task_->epoch != epoch || task_->next >= task_->items.size() ||
        task_->items[task_->next] != item) {
      Status st = local_->Run(epoch, item, out, outcome);
      // A slot's thread is none of the tuner's local workers: the time it
      // makes a given-back task in stays out of their figures.
      outcome->remote = given_back_;
      return st;
    }
    const size_t k = task_->next++;
    outcome->remote = true;
    if (task_->failures[k]) return *task_->failures[k];
    std::memcpy(out.data(), task_->samples.data() + k * sample_bytes_, sample_bytes_);
    outcome->label = task_->labels[k];
    return Status::Ok();
  }

  // Its local worker's: what a remote task holds the tuner counts apart
  // (WorkerKind::remote_task_bytes).
  WorkerCost cost() const override { return local_->cost(); }
  Status Ready() override { return local_->Ready(); }

 private:
  // Ends the last task: a local one's place is given back, a remote one's
  // samples dropped.
  void Settle() {
    if (taken_) slots_->Done(was_remote_);
    taken_ = false;
    task_.reset();
  }

  // The task's samples from the cluster, or nullopt when it gave them back.
  std::optional<RemoteTask> Send(int64_t epoch, std::span<const int64_t> items) {
    RemoteTask task{epoch, std::vector<int64_t>(items.begin(), items.end()), {}, {}, {}, 0};
    const size_t n = task.items.size();
    py::gil_scoped_acquire gil;
    try {
      py::object got = (*send_)(epoch, task.items, cap_.bytes);
      if (got.is_none()) return std::nullopt;
      auto [samples, labels, failures] =
          got.cast<std::tuple<py::buffer, std::vector<int64_t>, std::vector<WireFailure>>>();
      const py::buffer_info info = samples.request();
      const size_t bytes = static_cast<size_t>(info.size * info.itemsize);
      if (bytes != n * sample_bytes_ || labels.size() != n) {
        throw std::runtime_error("the cluster sent " + std::to_string(bytes) + " bytes and " +
                                 std::to_string(labels.size()) + " labels for " +
                                 std::to_string(n) + " samples");
      }
      const auto* from = static_cast<const std::byte*>(info.ptr);
      task.samples.assign(from, from + bytes);  // one copy, no zero-fill first
      task.labels = std::move(labels);
      task.failures.resize(n);
      for (auto& [position, code, message] : failures) {
        if (position >= 0 && static_cast<size_t>(position) < n) {
          task.failures[static_cast<size_t>(position)] = FromWire(code, message);
        }
      }
    } catch (const std::exception& e) {
      // stoker's own bug, not the data's: each sample of the task says so.
      const Status bug = Internal(std::string("a remote task's reply: ") + e.what());
      task.samples.assign(n * sample_bytes_, std::byte{0});
      task.labels.assign(n, 0);
      task.failures.assign(n, bug);
    }
    return task;
  }

  std::unique_ptr<KindWorker> local_;
  const std::shared_ptr<py::object> send_;
  const std::shared_ptr<RemoteSlots> slots_;
  const bool sends_;
  const size_t sample_bytes_;
  const SampleCap cap_;
  bool was_remote_ = false;
  bool taken_ = false;       // a place taken for the current task, not yet Done
  bool given_back_ = false;  // the current task came back from the cluster unmade
  std::optional<RemoteTask> task_;
};

// On a cluster's worker: samples `items` of `epoch` as a loader's engine
// makes them under `seed` and a per-sample cap of `cap_bytes`, as
// (samples: uint8 array, labels: list, failures: [(position, code, message)]).
py::tuple MakeSamples(const SourceHandle& source, const TransformHandle& transform, uint64_t seed,
                      int64_t epoch, const std::vector<int64_t>& items, size_t cap_bytes) {
  const size_t bytes = transform.transform->spec().bytes();
  py::array_t<uint8_t> samples(static_cast<py::ssize_t>(items.size() * bytes));
  std::vector<int64_t> labels(items.size(), 0);
  std::vector<WireFailure> failures;
  auto* base = reinterpret_cast<std::byte*>(samples.mutable_data());
  {
    py::gil_scoped_release release;
    SampleCap cap;
    cap.bytes = cap_bytes;
    SampleWorker worker(*source.source, *transform.transform, seed, cap);
    for (size_t k = 0; k < items.size(); ++k) {
      ItemOutcome outcome;
      Status st;
      try {
        st = worker.Run(epoch, items[k], {base + k * bytes, bytes}, &outcome);
      } catch (const std::exception& e) {
        st = Internal(std::string("the source or transform threw: ") + e.what());
      }
      if (st.ok()) {
        labels[k] = outcome.label;
      } else {
        std::memset(base + k * bytes, 0, bytes);
        failures.emplace_back(static_cast<int64_t>(k), static_cast<int>(st.code()),
                              std::string(st.message()));
      }
    }
  }
  return py::make_tuple(samples, labels, failures);
}

}  // namespace

LocalFirstSampleKind::LocalFirstSampleKind(std::shared_ptr<const WorkerKind> local, py::object send,
                                           std::shared_ptr<RemoteSlots> slots)
    : local_(std::move(local)),
      send_(new py::object(std::move(send)),
            [](py::object* o) {
              py::gil_scoped_acquire gil;
              delete o;
            }),
      slots_(std::move(slots)) {}

LocalFirstSampleKind::~LocalFirstSampleKind() = default;

std::unique_ptr<KindWorker> LocalFirstSampleKind::NewWorker(WorkerPlace place,
                                                            const SampleCap& cap) const {
  return std::make_unique<LocalFirstSampleWorker>(local_->NewWorker(place, cap), send_, slots_,
                                                  place, local_->spec().bytes(), cap);
}

void LocalFirstSampleKind::Resized(int workers, int remote) const {
  slots_->Resized(workers, remote);
  local_->Resized(workers - remote, 0);
}

void BindRemoteSamples(py::module_& m) {
  m.def(
      "sample_kind",
      [](const SourceHandle& source, const TransformHandle& transform, uint64_t seed) {
        return KindHandle{std::make_shared<SampleKind>(source.source, transform.transform, seed)};
      },
      py::arg("source"), py::arg("transform"), py::arg("seed"),
      "The engine's own kind: each item a sample of `source` through `transform`.");
  m.def(
      "local_first_samples",
      [](const KindHandle& local, py::object send, std::shared_ptr<RemoteSlots> slots) {
        if (!local.kind->items_are_samples()) {
          throw py::value_error("local_first_samples needs a kind whose items are samples");
        }
        return KindHandle{
            std::make_shared<LocalFirstSampleKind>(local.kind, std::move(send), std::move(slots))};
      },
      py::arg("local"), py::arg("send"), py::arg("slots"),
      "The engine's samples beside remote slots: `send(epoch, items, cap_bytes)` makes a "
      "remote slot's task on the cluster (see make_samples), or returns None.");
  m.def("make_samples", &MakeSamples, py::arg("source"), py::arg("transform"), py::arg("seed"),
        py::arg("epoch"), py::arg("items"), py::arg("cap_bytes"),
        "On a cluster's worker: samples `items` of `epoch` as a loader with `seed` makes them: "
        "(samples: a uint8 array, labels, failures: [(position, status code, message)]).");
}

}  // namespace stoker::python
