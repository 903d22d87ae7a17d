#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "stoker/image_sources.h"
#include "stoker/synthetic.h"

namespace stoker::python {
namespace {

namespace py = pybind11;

const char* KindName(DataPathKind kind) {
  switch (kind) {
    case DataPathKind::kImageFolder:
      return "image_folder";
    case DataPathKind::kTarShards:
      return "tar_shards";
    case DataPathKind::kFileList:
      break;
  }
  return "file_list";
}

// Opening lists folders or indexes shards: it blocks, so other Python threads
// run meanwhile. `open(kind)` opens the source and may say which kind it
// found (OpenDataPath) by setting `kind`.
template <typename Open>
SourceHandle OpenReleased(DataPathKind kind, Open&& open) {
  Result<std::shared_ptr<const Source>> source = [&] {
    py::gil_scoped_release release;
    return open(kind);
  }();
  return SourceHandle{ValueOrThrow(std::move(source)), KindName(kind), std::nullopt};
}

void CheckIndex(const SourceHandle& h, int64_t index) {
  if (index < 0 || index >= h.source->size()) {
    throw py::index_error("sample index " + std::to_string(index) + " out of range [0, " +
                          std::to_string(h.source->size()) + ")");
  }
}

// Source.read: the record, read with the GIL released.
py::tuple ReadRecord(const SourceHandle& h, int64_t index) {
  CheckIndex(h, index);
  ReadBuffer buffer;
  Record record;
  Status st;
  {
    py::gil_scoped_release release;
    st = h.source->Read(index, buffer, &record);
  }
  ThrowIfError(st);
  py::bytes bytes(reinterpret_cast<const char*>(record.bytes.data()), record.bytes.size());
  return py::make_tuple(bytes, record.label);
}

// stoker._stoker.Source: an opened source as Python holds it.
void BindSourceHandle(py::module_& m) {
  py::class_<SourceHandle>(m, "Source", "An opened, immutable source of samples.")
      .def_readonly("kind", &SourceHandle::kind)
      .def("__len__", [](const SourceHandle& h) { return h.source->size(); })
      .def(
          "key",
          [](const SourceHandle& h, int64_t index) {
            CheckIndex(h, index);
            return py::bytes(h.source->Key(index));
          },
          py::arg("index"), "The sample's key (a path, 'shard.tar:member'), as bytes.")
      .def("read", &ReadRecord, py::arg("index"), "The sample's raw record: (bytes, label).")
      .def("class_names", [](const SourceHandle& h) {
        py::list names;
        for (const std::string& n : h.source->ClassNames()) names.append(py::bytes(n));
        return names;
      });
}

// stoker._stoker.TarShardReader: one shard's samples in order, read with the
// GIL released. The lock keeps two Python threads out of one reader (which
// is for one thread at a time).
struct TarShardStream {
  std::unique_ptr<TarShardReader> reader;
  std::mutex mutex;
  TarStreamSample sample;
};

void BindTarShardReader(py::module_& m) {
  py::class_<TarShardStream>(m, "TarShardReader",
                             "One tar shard's samples in member order, as (key, bytes, label); "
                             "opens that shard only, indexes nothing first.")
      .def(py::init([](const std::string& path) {
             Result<std::unique_ptr<TarShardReader>> reader = [&] {
               py::gil_scoped_release release;
               return TarShardReader::Open(path);
             }();
             auto stream = std::make_unique<TarShardStream>();
             stream->reader = ValueOrThrow(std::move(reader));
             return stream;
           }),
           py::arg("path"))
      .def("__iter__", [](py::object self) { return self; })
      .def(
          "broken",
          [](TarShardStream& s) {
            std::lock_guard lock(s.mutex);
            return s.reader->broken();
          },
          py::call_guard<py::gil_scoped_release>(),  // the lock may be held by a __next__
          "Whether the archive's error ended the stream (not one sample's: those go on).")
      .def("__next__", [](TarShardStream& s) {
        std::unique_lock lock(s.mutex, std::defer_lock);
        Result<bool> more = false;
        {
          py::gil_scoped_release release;
          lock.lock();
          more = s.reader->Next(&s.sample);
        }
        if (!ValueOrThrow(std::move(more))) throw py::stop_iteration();
        return py::make_tuple(
            py::bytes(s.sample.key),
            py::bytes(reinterpret_cast<const char*>(s.sample.image.data()), s.sample.image.size()),
            s.sample.label);
      });
}

}  // namespace

void BindSources(py::module_& m) {
  BindSourceHandle(m);
  BindTarShardReader(m);

  m.def(
      "open_image_folder",
      [](const std::string& root) {
        return OpenReleased(DataPathKind::kImageFolder,
                            [&](DataPathKind&) { return OpenImageFolder(root); });
      },
      py::arg("root"));
  m.def(
      "open_file_list",
      [](const std::string& list_path) {
        return OpenReleased(DataPathKind::kFileList,
                            [&](DataPathKind&) { return OpenFileList(list_path); });
      },
      py::arg("list_path"));
  m.def(
      "open_tar_shards",
      [](const std::vector<std::string>& shards) {
        return OpenReleased(DataPathKind::kTarShards,
                            [&](DataPathKind&) { return OpenTarShards(shards); });
      },
      py::arg("shards"));
  m.def(
      "open_data_path",
      [](const std::string& path) {
        return OpenReleased(DataPathKind::kImageFolder,
                            [&](DataPathKind& kind) { return OpenDataPath(path, &kind); });
      },
      py::arg("path"),
      "The source a path names (a folder, '*.tar' or a brace pattern, a list file); "
      "its `kind` says which.");
  m.def(
      "expand_braces",
      [](const std::string& pattern) {
        py::list out;
        for (const std::string& s : ValueOrThrow(ExpandBraces(pattern))) out.append(py::bytes(s));
        return out;
      },
      py::arg("pattern"));
  m.def(
      "expand_shards",
      [](const std::vector<std::string>& patterns) {
        py::list out;
        for (const std::string& s : ValueOrThrow(ExpandShards(patterns))) out.append(py::bytes(s));
        return out;
      },
      py::arg("patterns"),
      "The shard paths a list of paths or brace patterns names; a shard named twice is refused.");
  m.def(
      "open_synthetic",
      [](int64_t size, const std::vector<int64_t>& shape, const std::string& dtype,
         int64_t num_classes, uint64_t content_seed, int64_t cpu_cost_ns, int64_t read_latency_ns,
         std::vector<int64_t> fail_indices) {
        SampleSpec spec{shape, DTypeFromName(dtype)};
        ThrowIfError(spec.Check("synthetic shape"));
        SyntheticOptions o;
        o.size = size;
        o.sample_bytes = spec.bytes();
        o.num_classes = num_classes;
        o.content_seed = content_seed;
        o.cpu_cost = std::chrono::nanoseconds(cpu_cost_ns);
        o.read_latency = std::chrono::nanoseconds(read_latency_ns);
        o.fail_indices = std::move(fail_indices);
        return SourceHandle{ValueOrThrow(MakeSyntheticSource(o)), "synthetic", spec};
      },
      py::arg("size"), py::arg("shape"), py::arg("dtype"), py::arg("num_classes"),
      py::arg("content_seed"), py::arg("cpu_cost_ns"), py::arg("read_latency_ns"),
      py::arg("fail_indices"));
}

}  // namespace stoker::python
