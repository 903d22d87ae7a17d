// _stoker.native_batch_kind and _stoker.open_path_source: stoker.DataLoader's
// native path (native_batch_kind.h, python/stoker/_native.py).

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "native_batch_kind.h"
#include "stoker/image_sources.h"

namespace stoker::python {

namespace py = pybind11;

void BindNativeBatches(py::module_& m) {
  m.def(
      "open_path_source",
      [](const std::vector<std::string>& paths, const std::vector<int64_t>& labels,
         std::vector<std::string> class_names) {
        Result<std::shared_ptr<const Source>> source = [&] {
          py::gil_scoped_release release;
          return MakePathSource(paths, labels, std::move(class_names));
        }();
        return SourceHandle{ValueOrThrow(std::move(source)), "file_list", std::nullopt};
      },
      py::arg("paths"), py::arg("labels"), py::arg("class_names"),
      "A source of these files (bytes) with these labels, in order (a torchvision dataset's "
      "samples).");
  m.def(
      "native_batch_kind",
      [](const SourceHandle& source, const TransformHandle& transform,
         std::shared_ptr<EpochBatches> batches, int64_t max_batch) {
        if (max_batch < 1) {
          throw py::value_error("max_batch must be >= 1, got " + std::to_string(max_batch));
        }
        return KindHandle{std::make_shared<NativeBatchKind>(source.source, transform.transform,
                                                            std::move(batches), max_batch)};
      },
      py::arg("source"), py::arg("transform"), py::arg("batches"), py::arg("max_batch"),
      "The user's batches (indices in `batches`) made by `source` through `transform` on the "
      "engine's threads, each whole in its item (protocol.NATIVE_BATCH).");
}

}  // namespace stoker::python
