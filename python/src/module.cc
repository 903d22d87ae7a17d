// The _stoker extension: thin bindings over the C++ API. Argument defaults,
// "auto" values and torch conversion live in the pure-Python package
// (python/stoker), so each binding here maps one C++ call.
#include <pybind11/pybind11.h>

#include <nlohmann/json.hpp>
#include <string>

#include "bindings.h"
#include "errors.h"
#include "stoker/version.h"

PYBIND11_MODULE(_stoker, m) {
  m.doc() = "stoker's C++ engine (use the `stoker` package, not this module)";
  m.attr("__version__") = stoker::kVersion;
  stoker::python::RegisterErrors(m);
  stoker::python::BindSources(m);
  stoker::python::BindTransforms(m);
  stoker::python::BindLoader(m);
  stoker::python::BindMachine(m);
  stoker::python::BindDataset(m);
  stoker::python::BindWorkerProtocol(m);
  stoker::python::BindProcessWorkers(m);
  stoker::python::BindThreadWorkers(m);
  stoker::python::BindWorkerKinds(m);
  stoker::python::BindRemoteSlots(m);
  stoker::python::BindRemoteSamples(m);
  stoker::python::BindNativeBatches(m);
  stoker::python::BindSweepReport(m);
  // For tests: no C++ JSON carries a key from the data yet, so this is how
  // they reach JsonToPython's decoding of a key that is not UTF-8.
  m.def(
      "_json_object_with_key",
      [](const pybind11::bytes& key) {
        nlohmann::json object = nlohmann::json::object();
        object[std::string(key)] = std::string(key);
        return stoker::python::JsonToPython(object);
      },
      pybind11::arg("key"), "JsonToPython({key: key}), for tests.");
}
