#include <Python.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "stoker/defaults.h"
#include "stoker/gpu_sampler.h"
#include "stoker/loader.h"
#include "stoker/report.h"
#include "stoker/tuner.h"

namespace stoker::python {
namespace {

namespace py = pybind11;

// How long one GIL-free wait lasts before Python gets to run its signal
// handlers (Ctrl-C): short enough to feel instant, long enough to cost nothing.
constexpr std::chrono::milliseconds kWaitSlice{50};

// How long close() waits for workers still on an item (a read of a store
// that hangs) before it names their items; at the interpreter's exit it then
// leaves them behind, as nothing can use the loader any more.
constexpr std::chrono::seconds kCloseNamesAfter{10};

// Set once the interpreter's exit closes the loaders left open (_exit.py).
std::atomic<bool> closing_at_exit{false};

// What `held` says of the items that kept the workers from leaving: those
// the same workers were on when the wait began (`first`) and still are.
std::string HeldUp(const std::vector<ItemInProgress>& first,
                   const std::vector<ItemInProgress>& now) {
  std::string names;
  int held = 0;
  for (const ItemInProgress& n : now) {
    if (std::ranges::none_of(first, [&](const ItemInProgress& f) {
          return f.worker == n.worker && f.item == n.item;
        })) {
      continue;
    }
    names += (held++ == 0 ? "" : ", ") + n.name;
  }
  if (held == 0) return "for its workers to leave";
  return "for " + std::to_string(held) + (held == 1 ? " worker" : " workers") + " still on " +
         names + " (a read or transform that has not returned: a store that hangs?)";
}

// The images of a batch as a numpy array over the batch's own buffer. The
// array's base is a capsule that owns the Batch, so the buffer goes back to
// the loader's pool exactly when the last array (or torch tensor made with
// torch.from_numpy) viewing it is gone -- possibly after the loader itself.
py::array ImagesOf(Batch batch) {
  std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(batch.size())};
  for (int64_t d : batch.spec().shape) shape.push_back(static_cast<py::ssize_t>(d));
  py::dtype dtype = NumpyDType(batch.spec().dtype);
  void* data = batch.mutable_data().data();
  auto* owned = new Batch(std::move(batch));
  py::capsule base(owned, [](void* p) { delete static_cast<Batch*>(p); });
  return py::array(dtype, shape, data, base);
}

// A batch's device buffer for torch.as_tensor, through
// __cuda_array_interface__ (version 3): it owns the Batch, and torch keeps
// this object alive while a tensor made from it lives, so the device buffer
// goes back to the loader's pool only after the tensor is gone.
class DeviceImages {
 public:
  explicit DeviceImages(Batch batch) : batch_(std::move(batch)) {}

  py::dict Interface() const {
    py::list shape;
    shape.append(batch_.size());
    for (int64_t d : batch_.spec().shape) shape.append(d);
    py::dict cai;
    cai["shape"] = py::tuple(shape);
    cai["typestr"] = NumpyDType(batch_.spec().dtype).attr("str");
    cai["data"] = py::make_tuple(reinterpret_cast<std::uintptr_t>(batch_.device_data()), false);
    cai["strides"] = py::none();
    // The consumer's stream already waits on the copy (Batch::WaitOn in next()).
    cai["stream"] = py::none();
    cai["version"] = 3;
    return cai;
  }

 private:
  Batch batch_;
};

// Marks the loader as in use by one Python thread for the length of a call:
// the C++ consumer calls are not for two threads at once, and with the GIL
// released two Python threads could otherwise get there together.
// `owner` says which thread: close() from inside that very call (user code
// the consumer's thread runs at num_workers=0) could never wait for it.
class ConsumerTurn {
 public:
  ConsumerTurn(std::atomic<bool>& busy, std::atomic<std::thread::id>& owner)
      : busy_(busy), owner_(owner) {
    if (busy_.exchange(true)) {
      // The binding serves stoker.Loader and stoker.DataLoader alike: named so.
      throw py::value_error(
          "this stoker loader is being iterated by another thread: one thread at a time takes "
          "its batches (make a loader per thread)");
    }
    owner_.store(std::this_thread::get_id());
  }
  ~ConsumerTurn() {
    owner_.store(std::thread::id());
    busy_.store(false);
  }
  ConsumerTurn(const ConsumerTurn&) = delete;
  ConsumerTurn& operator=(const ConsumerTurn&) = delete;

 private:
  std::atomic<bool>& busy_;
  std::atomic<std::thread::id>& owner_;
};

class PyLoader {
 public:
  explicit PyLoader(LoaderOptions options) {
    Result<std::unique_ptr<Loader>> made = [&] {
      py::gil_scoped_release release;
      return Loader::Make(std::move(options));
    }();
    loader_ = ValueOrThrow(std::move(made));
    // A batch made on the consumer's thread (no workers) stops for Ctrl-C
    // too: Python's handlers run between its samples, every kWaitSlice.
    loader_->SetInterrupt([last = std::chrono::steady_clock::time_point()]() mutable {
      const auto now = std::chrono::steady_clock::now();
      if (now - last < kWaitSlice) return false;
      last = now;
      py::gil_scoped_acquire gil;
      return PyErr_CheckSignals() != 0;  // the handler's exception stays set for Next
    });
  }

  // No thread can be inside a method here: each call holds a reference.
  ~PyLoader() { Destroy(); }

  // (images, labels), or None at the end of the epoch. With a device, images
  // is a DeviceImages, and `stream` (a cudaStream_t as an integer; 0: none)
  // is made to wait for its copy.
  py::object Next(std::uintptr_t stream) {
    Loader& l = loader();
    ConsumerTurn turn(busy_, owner_);
    // Wait in slices first so that Ctrl-C is heard at once; the engine counts
    // this wait as the consumer's and ticks the tuner meanwhile.
    if (pending_) return std::exchange(pending_, std::nullopt)->got;
    WaitInterruptibly(l);
    Result<std::optional<Batch>> next = [&] {
      py::gil_scoped_release release;
      return l.Next();
    }();
    if (!next.ok() && PyErr_Occurred() != nullptr) throw py::error_already_set();  // interrupted
    ThrowIfError(next.status());
    if (!next->has_value()) return py::none();
    Batch batch = std::move(**next);
    const int64_t epoch = batch.epoch(), index = batch.index();
    std::span<const int64_t> labels = batch.labels();
    py::array_t<int64_t> label_array(static_cast<py::ssize_t>(labels.size()));
    std::copy(labels.begin(), labels.end(), label_array.mutable_data());
    py::object got;
    if (batch.device_data() != nullptr) {
      if (stream != 0) ThrowIfError(batch.WaitOn(reinterpret_cast<void*>(stream)));
      got = py::make_tuple(py::cast(DeviceImages(std::move(batch))), label_array);
    } else {
      got = py::make_tuple(ImagesOf(std::move(batch)), label_array);
    }
    // Ctrl-C while the batch was taken: Python would raise it as this call
    // returns, and the batch, counted delivered, would be lost. It is kept
    // for the next call instead, and checkpoints count it undelivered.
    if (PyErr_CheckSignals() != 0) {
      pending_ = Pending{std::move(got), epoch, index};
      throw py::error_already_set();
    }
    return got;
  }

  LoaderMetrics Metrics() { return loader().Metrics(); }

  // Waits up to `timeout_s` for a batch, in slices so that Ctrl-C is heard;
  // true when next() would not block.
  bool WaitReady(double timeout_s) {
    ConsumerTurn turn(busy_, owner_);
    Loader& l = loader();
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (true) {
      const auto left = deadline - std::chrono::steady_clock::now();
      bool ready;
      {
        py::gil_scoped_release release;
        ready = l.WaitReady(std::min<std::chrono::nanoseconds>(
            kWaitSlice, std::chrono::duration_cast<std::chrono::nanoseconds>(left)));
      }
      if (ready) return true;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (std::chrono::steady_clock::now() >= deadline) return false;
    }
  }

  // `items`: the epoch's item count, for a kind whose count changes (None: unchanged).
  void SetEpoch(int64_t epoch, std::optional<int64_t> items, bool keep_ahead) {
    Loader& l = loader();
    ConsumerTurn turn(busy_, owner_);
    pending_.reset();  // the epoch it belonged to is left
    ThrowIfError(items ? l.SetEpoch(epoch, *items, keep_ahead) : l.SetEpoch(epoch));
  }

  py::object State() {
    Loader& l = loader();
    ConsumerTurn turn(busy_, owner_);
    LoaderState state = ValueOrThrow(l.State());
    if (pending_ && pending_->epoch == state.epoch) Undeliver(state, pending_->index);
    return JsonToPython(LoaderStateToJson(state));
  }

  // `state_json`: LoaderStateToJson's form, as text.
  void Restore(const std::string& state_json) {
    nlohmann::json parsed = nlohmann::json::parse(state_json, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) ThrowIfError(InvalidArgument("state is not JSON: " + state_json));
    LoaderState s = ValueOrThrow(LoaderStateFromJson(parsed));
    Loader& l = loader();
    ConsumerTurn turn(busy_, owner_);
    pending_.reset();  // the checkpoint says what is delivered
    ThrowIfError(l.Restore(s));
  }

  // From any thread: a call under way in another thread (next() waiting for
  // a batch) is stopped and returns an error; it is waited for, then the
  // loader goes. Without the GIL while waiting: that thread needs it to leave.
  void Close() {
    if (busy_.load() && owner_.load() == std::this_thread::get_id()) {
      throw py::value_error(
          "close() from inside this stoker loader's own next() (the dataset's code, run by "
          "the iterating thread at num_workers=0): close it after the call returns");
    }
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> one_closer(close_mu_);
    if (busy_.exchange(true)) {
      if (loader_) loader_->Stop();
      while (busy_.exchange(true)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    struct Leave {
      std::atomic<bool>& busy;
      ~Leave() { busy.store(false); }
    } leave{busy_};
    py::gil_scoped_acquire gil;
    Destroy(/*interruptible=*/true);
  }

  bool closed() const { return !loader_; }

  // The loader, or an exception: closed, or (RuntimeError) used in a child
  // forked since it was made, where its worker threads do not exist and
  // every call, even for metrics, could wait for ever on their locks.
  Loader& loader() {
    if (!loader_) throw py::value_error("this stoker.Loader is closed");
    ThrowIfError(loader_->CheckProcess());
    return *loader_;
  }

 private:
  // Waits until Next() would not block, in slices with the GIL released,
  // letting Python run its signal handlers between them: Ctrl-C raises
  // KeyboardInterrupt here and the loader stays usable.
  void WaitInterruptibly(Loader& l) {
    while (true) {
      bool ready;
      {
        py::gil_scoped_release release;
        ready = l.WaitReady(kWaitSlice);
      }
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();  // before a batch is taken
      if (ready) return;
    }
  }

  // `state` with batch `index` of its epoch not delivered (a pending one).
  static void Undeliver(LoaderState& state, int64_t index) {
    auto& beyond = state.beyond;
    if (const auto at = std::ranges::find(beyond, index); at != beyond.end()) {
      beyond.erase(at);
    } else if (index < state.position) {
      for (int64_t b = index + 1; b < state.position; ++b) beyond.push_back(b);
      std::ranges::sort(beyond);
      state.position = index;
    }
  }

  // `interruptible` (close(), not the destructor): the wait for the workers
  // runs in slices between which Python handles its signals; Ctrl-C then
  // leaves the workers still on an item behind, as does the exit once it
  // named them.
  void Destroy(bool interruptible = false) {
    // Taken out first, with the GIL held, so that other threads see the
    // loader closed; joining its workers (up to one sample's time each) then
    // runs without the GIL.
    pending_.reset();  // its batch goes back to the loader's pool first
    std::unique_ptr<Loader> doomed = std::move(loader_);
    if (!doomed) return;
    if (interruptible) {
      const auto start = std::chrono::steady_clock::now();
      std::vector<ItemInProgress> first;
      bool named = false;
      for (int slice = 0;; ++slice) {
        bool left;
        {
          py::gil_scoped_release release;
          left = doomed->StopWithin(kWaitSlice);
        }
        if (left) break;
        if (slice == 0) first = doomed->InProgress();
        if (!named && std::chrono::steady_clock::now() - start >= kCloseNamesAfter) {
          named = true;
          const bool at_exit = closing_at_exit.load();
          const std::string message = "stoker: close() has waited " +
                                      std::to_string(kCloseNamesAfter.count()) + " s " +
                                      HeldUp(first, doomed->InProgress()) +
                                      (at_exit ? "; the interpreter exits without them"
                                               : "; Ctrl-C stops waiting and leaves them behind");
          if (PyErr_WarnEx(PyExc_RuntimeWarning, message.c_str(), 1) != 0) {
            LeaveBehind(std::move(doomed));
            throw py::error_already_set();  // the warning, made an error
          }
          if (at_exit) return LeaveBehind(std::move(doomed));
        }
        if (PyErr_CheckSignals() != 0) {
          LeaveBehind(std::move(doomed));
          throw py::error_already_set();
        }
      }
    }
    py::gil_scoped_release release;
    doomed.reset();
  }

  // A stopped loader whose workers are still on an item is never destroyed:
  // they use it until their item returns, then leave (or end with the process).
  static void LeaveBehind(std::unique_ptr<Loader> stopped) { static_cast<void>(stopped.release()); }

  // A batch taken by a Next() that Ctrl-C stopped, for the next one.
  struct Pending {
    py::object got;
    int64_t epoch = 0, index = 0;
  };
  std::optional<Pending> pending_;
  std::unique_ptr<Loader> loader_;
  std::atomic<bool> busy_{false};
  std::atomic<std::thread::id> owner_;  // the thread whose call holds busy_
  std::mutex close_mu_;                 // one Close at a time
};

// Options built by name, as Python spells them: LoaderOptions(batch_size=64,
// workers=AUTO_WORKERS, ...). A field given None keeps its default; a name
// that is no field is a TypeError naming it.
template <typename Options>
Options FromKeywords(const char* type_name, const py::kwargs& fields) {
  Options options;
  py::object view = py::cast(&options, py::return_value_policy::reference);
  for (const auto& [name, value] : fields) {
    if (value.is_none()) continue;
    if (!py::hasattr(view, name)) {
      throw py::type_error(std::string(type_name) + " has no field '" +
                           py::str(name).cast<std::string>() + "'");
    }
    view.attr(name) = value;
  }
  return options;
}

void BindOptions(py::module_& m) {
  py::enum_<ErrorPolicy>(m, "ErrorPolicy", "What happens to a sample that cannot be made.")
      .value("RAISE", ErrorPolicy::kRaise)
      .value("SKIP", ErrorPolicy::kSkip);
  py::class_<TunerOptions>(m, "TunerOptions", "stoker::TunerOptions, set by keyword.")
      .def(py::init([](const py::kwargs& fields) {
        return FromKeywords<TunerOptions>("TunerOptions", fields);
      }))
      .def_readwrite("memory_budget_bytes", &TunerOptions::memory_budget_bytes)
      .def_readwrite("memory_budget_name", &TunerOptions::memory_budget_name)
      .def_readwrite("max_workers", &TunerOptions::max_workers)
      .def_readwrite("initial_workers", &TunerOptions::initial_workers)
      .def_readwrite("interval_s", &TunerOptions::interval_s)
      .def_readwrite("remote_min", &TunerOptions::remote_min)
      .def_readwrite("trace_path", &TunerOptions::trace_path);
  py::class_<KindHandle>(m, "WorkerKind",
                         "How a DataLoader's batches are made (processes, threads); "
                         "LoaderOptions.kind.");
  py::class_<LoaderOptions>(m, "LoaderOptions", "stoker::LoaderOptions, set by keyword.")
      .def(py::init([](const py::kwargs& fields) {
        return FromKeywords<LoaderOptions>("LoaderOptions", fields);
      }))
      .def_property(
          "source",
          [](const LoaderOptions& o) {
            return SourceHandle{o.source, "", std::nullopt};
          },
          [](LoaderOptions& o, const SourceHandle& h) { o.source = h.source; })
      .def_property(
          "transform",
          [](const LoaderOptions& o) {
            return TransformHandle{o.transform, ""};
          },
          [](LoaderOptions& o, const TransformHandle& h) { o.transform = h.transform; })
      .def_property(
          "kind", [](const LoaderOptions& o) { return KindHandle{o.kind}; },
          [](LoaderOptions& o, const KindHandle& h) { o.kind = h.kind; })
      .def_readwrite("batch_size", &LoaderOptions::batch_size)
      .def_readwrite("shuffle", &LoaderOptions::shuffle)
      .def_readwrite("seed", &LoaderOptions::seed)
      .def_readwrite("drop_last", &LoaderOptions::drop_last)
      .def_readwrite("rank", &LoaderOptions::rank)
      .def_readwrite("world_size", &LoaderOptions::world_size)
      .def_readwrite("pad_shards", &LoaderOptions::pad_shards)
      .def_readwrite("workers", &LoaderOptions::workers)
      .def_readwrite("prefetch_batches", &LoaderOptions::prefetch_batches)
      .def_readwrite("prefetch_bytes", &LoaderOptions::prefetch_bytes)
      .def_readwrite("on_error", &LoaderOptions::on_error)
      .def_readwrite("ordered", &LoaderOptions::ordered)
      .def_readwrite("batch_scheduling", &LoaderOptions::batch_scheduling)
      .def_readwrite("start_epoch", &LoaderOptions::start_epoch)
      .def_readwrite("pin_memory", &LoaderOptions::pin_memory)
      .def_readwrite("device", &LoaderOptions::device)
      .def_readwrite("device_prefetch_bytes", &LoaderOptions::device_prefetch_bytes)
      .def_readwrite("tuner", &LoaderOptions::tuner);
}

}  // namespace

// Every GPU's use (NVML), as dicts; or the reason there is none, as a str.
// NVML is opened once per process, on first use.
py::object GpuUsageNow(bool pcie) {
  static const Result<std::unique_ptr<GpuSampler>>* sampler =
      new Result<std::unique_ptr<GpuSampler>>(GpuSampler::Open());  // never freed: lives on
  if (!sampler->ok()) return py::str(sampler->status().message());
  std::vector<GpuUsage> gpus;
  {
    py::gil_scoped_release release;
    gpus = (**sampler)->Sample(pcie);
  }
  py::list out;
  for (const GpuUsage& g : gpus) {
    py::dict d;
    d["index"] = g.index;
    d["utilization_percent"] = g.utilization_percent;
    d["memory_used_bytes"] = g.memory_used_bytes;
    d["memory_total_bytes"] = g.memory_total_bytes;
    d["pcie_rx_bytes_per_s"] = g.pcie_rx_bytes_per_s;
    d["pcie_tx_bytes_per_s"] = g.pcie_tx_bytes_per_s;
    out.append(d);
  }
  return out;
}

void BindLoader(py::module_& m) {
  m.def("gpu_usage", &GpuUsageNow, py::arg("pcie") = true,
        "Every GPU's utilisation, memory and PCIe throughput (NVML; -1 where unknown) as a "
        "list of dicts, or a str saying why there is none ('no GPU (NVML not found: ...)'). "
        "PCIe takes NVML ~20 ms per GPU and direction.");
  py::class_<DeviceImages>(m, "DeviceImages",
                           "A batch's images on a CUDA device, for torch.as_tensor; owns the "
                           "batch while alive.")
      .def_property_readonly("__cuda_array_interface__", &DeviceImages::Interface);

  // The shared defaults (stoker/defaults.h), so that Python repeats none of them.
  m.attr("AUTO_WORKERS") = kAutoWorkers;
  m.attr("MAX_WORKERS") = kMaxWorkers;
  m.attr("MAX_EPOCH") = kMaxEpoch;
  m.attr("MEMORY_BUDGET_SHARE") = kMemoryBudgetShare;
  m.attr("RECENT_WINDOW_S") = kRecentWindowS;
  m.def(
      "closing_at_exit", [] { closing_at_exit.store(true); },
      "From now on, close() leaves behind the workers still on an item once it named them "
      "(the interpreter is exiting).");
  m.def("default_prefetch", &DefaultPrefetch, py::arg("workers"), py::arg("batch_items"),
        "The prefetch depth, in batches of `batch_items` items, for a fixed worker count when "
        "none is given.");
  m.def("stall_fraction", &StallFraction, py::arg("wait_s"), py::arg("elapsed_s"),
        "The share of `elapsed_s` the consumer spent waiting, in [0, 1].");
  BindOptions(m);

  py::class_<PyLoader>(m, "Loader", "The C++ loader; see stoker.Loader for the Python API.")
      .def(py::init<LoaderOptions>(), py::arg("options"))
      .def("next", &PyLoader::Next, py::arg("stream") = 0,
           "The next (images, labels) as numpy arrays, or None at the end of the epoch; with "
           "a device, images is a DeviceImages (__cuda_array_interface__) and `stream` "
           "(cudaStream_t as an int) waits for its copy. Waits with the GIL released; Ctrl-C "
           "interrupts the wait.")
      .def("wait_ready", &PyLoader::WaitReady, py::arg("timeout_s"),
           "Waits up to timeout_s for a batch (Ctrl-C interrupts); True when next() would "
           "not block.")
      .def("set_epoch", &PyLoader::SetEpoch, py::arg("epoch"), py::arg("items") = py::none(),
           py::arg("keep_ahead") = true,
           "Starts `epoch` next; with a kind, `items` is its item count (and the next "
           "epochs'), and keep_ahead=False drops what was made ahead for it.")
      .def("state", &PyLoader::State)
      .def("restore", &PyLoader::Restore, py::arg("state"))
      .def("close", &PyLoader::Close,
           "Stops the loader and waits for its workers; after 10 s a RuntimeWarning names the "
           "items they are still on, and Ctrl-C leaves those behind.")
      .def_property_readonly("closed", &PyLoader::closed)
      .def_property_readonly("epoch", [](PyLoader& l) { return l.loader().epoch(); })
      .def_property_readonly("batches_per_epoch",
                             [](PyLoader& l) { return l.loader().batches_per_epoch(); })
      .def_property_readonly("samples_per_epoch",
                             [](PyLoader& l) { return l.loader().samples_per_epoch(); })
      .def_property_readonly("workers", [](PyLoader& l) { return l.loader().workers(); })
      .def_property_readonly("pin_skipped", [](PyLoader& l) { return l.loader().pin_skipped(); })
      .def(
          "resize",
          [](PyLoader& l, int workers) {
            if (workers < 0 || workers > kMaxWorkers) {
              throw py::value_error("workers must be in [0, " + std::to_string(kMaxWorkers) +
                                    "], got " + std::to_string(workers));
            }
            ThrowIfError(l.loader().Resize(workers));
          },
          py::arg("workers"))
      .def("metrics", [](PyLoader& l) { return JsonToPython(LoaderMetricsToJson(l.Metrics())); })
      .def(
          "awaited",
          [](PyLoader& l) -> py::object {
            std::optional<AwaitedBatch> head = l.loader().Awaited();
            if (!head) return py::none();
            py::dict d;
            d["epoch"] = head->epoch;
            d["batch"] = head->batch;
            d["items"] = head->items;
            d["waited_s"] = static_cast<double>(head->waited_ns) / 1e9;
            return d;
          },
          "The batch the consumer waits for inside next() now (epoch, batch, its items, "
          "waited_s), or None.")
      .def("tuner_view",
           [](PyLoader& l) {
             std::optional<TunerView> view = l.loader().tuner_view();
             return view ? JsonToPython(TunerViewToJson(*view)) : py::none();
           })
      .def("tuner_trace",
           [](PyLoader& l) {
             nlohmann::json trace = nlohmann::json::array();
             for (const TunerDecision& d : l.loader().tuner_trace()) {
               trace.push_back(TunerDecisionToJson(d));
             }
             return JsonToPython(trace);
           })
      .def(
          "flush_trace",
          [](PyLoader& l) {
            Status written;
            {
              py::gil_scoped_release release;  // it waits for the disk
              written = l.loader().FlushTrace();
            }
            ThrowIfError(written);
          },
          "Waits until the tuner's decisions so far are in trace_path; raises the first "
          "error writing it (OSError naming the file).")
      .def("skipped",
           [](PyLoader& l) {
             nlohmann::json skipped = nlohmann::json::array();
             for (const SkipRecord& r : l.loader().Skipped())
               skipped.push_back(SkipRecordToJson(r));
             return JsonToPython(skipped);
           })
      .def("stop", [](PyLoader& l) { l.loader().Stop(); });
}

}  // namespace stoker::python
