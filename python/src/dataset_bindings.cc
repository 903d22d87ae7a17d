#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "bindings.h"
#include "errors.h"
#include "stoker/dataset.h"

namespace stoker::python {

namespace py = pybind11;

void BindDataset(py::module_& m) {
  m.def(
      "make_dataset",
      [](const std::string& output, int64_t images, int classes, uint64_t seed, int shards,
         const std::string& photos) {
        MakeDatasetOptions o;
        o.output = output;
        o.images = images;
        o.classes = classes;
        o.seed = seed;
        o.shards = shards;
        o.photos = photos;
        Result<MakeDatasetReport> made = [&] {
          py::gil_scoped_release release;  // seconds to minutes of encoding
          return MakeDataset(o);
        }();
        MakeDatasetReport r = ValueOrThrow(std::move(made));
        py::dict d;
        d["root"] = py::bytes(r.root);
        py::list names;
        for (const std::string& n : r.class_names) names.append(DecodeText(n));
        d["classes"] = names;
        d["images"] = r.images;
        d["bytes"] = r.bytes;
        d["mean_pixels"] = r.mean_pixels;
        d["photos_used"] = r.photos_used;
        py::list shard_paths;
        for (const std::string& s : r.shard_paths) shard_paths.append(py::bytes(s));
        d["shards"] = shard_paths;
        d["seconds"] = r.seconds;
        return d;
      },
      py::arg("output"), py::arg("images"), py::arg("classes"), py::arg("seed"), py::arg("shards"),
      py::arg("photos"));
  m.def("default_dataset_path", [] { return py::bytes(DefaultDatasetPath()); });
  m.def(
      "ensure_default_dataset",
      [](bool quiet) {
        Result<std::string> path = [&] {
          py::gil_scoped_release release;
          return EnsureDefaultDataset(quiet);
        }();
        return py::bytes(ValueOrThrow(std::move(path)));
      },
      py::arg("quiet"));
}

}  // namespace stoker::python
