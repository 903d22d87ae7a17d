#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "stoker/sample_spec.h"
#include "stoker/source.h"
#include "stoker/transform.h"
#include "stoker/worker_kind.h"

namespace stoker::python {

/// An opened source as Python holds it. Sources are immutable and shared by
/// every loader made from them.
struct SourceHandle {
  std::shared_ptr<const Source> source;
  std::string kind;  // "image_folder", "file_list", "tar_shards", "synthetic"
  /// The sample a raw transform makes of each record, for sources whose
  /// records are already samples (synthetic); a loader uses it when no
  /// transform is given.
  std::optional<SampleSpec> raw_spec;
};

/// A worker kind as Python holds it (the DataLoader's processes or threads),
/// for LoaderOptions.kind.
struct KindHandle {
  std::shared_ptr<const WorkerKind> kind;
};

/// A transform as Python holds it; immutable, shareable between loaders.
struct TransformHandle {
  std::shared_ptr<const Transform> transform;
  std::string description;
};

/// `text` as a Python str; bytes that are not UTF-8 (paths may hold any)
/// appear as backslash escapes instead of failing.
inline pybind11::str DecodeText(const std::string& text) {
  return pybind11::reinterpret_steal<pybind11::str>(
      PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "backslashreplace"));
}

/// numpy's name for `dtype`: "uint8", "float32", "int64".
pybind11::dtype NumpyDType(DType dtype);
/// The DType numpy calls `name`; ValueError for others.
DType DTypeFromName(const std::string& name);

/// `json` as Python objects (dict, list, str, int, float, bool, None): the one
/// place where the C++ side's JSON (report.h, probe.h, tuner.h) becomes what
/// Python users see. Strings are decoded like os.fsdecode (UTF-8, undecodable
/// bytes as surrogate escapes), so paths in them survive os.fsencode.
pybind11::object JsonToPython(const nlohmann::json& json);

void BindSources(pybind11::module_& m);
void BindTransforms(pybind11::module_& m);
void BindLoader(pybind11::module_& m);
void BindMachine(pybind11::module_& m);
void BindDataset(pybind11::module_& m);
void BindWorkerProtocol(pybind11::module_& m);
void BindProcessWorkers(pybind11::module_& m);
void BindThreadWorkers(pybind11::module_& m);
void BindWorkerKinds(pybind11::module_& m);
void BindRemoteSlots(pybind11::module_& m);
void BindRemoteSamples(pybind11::module_& m);
void BindNativeBatches(pybind11::module_& m);
void BindSweepReport(pybind11::module_& m);

}  // namespace stoker::python
