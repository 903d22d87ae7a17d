#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cerrno>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "bindings.h"
#include "stoker/image_sources.h"
#include "stoker/probe.h"

namespace stoker::python {

namespace py = pybind11;

void BindMachine(py::module_& m) {
  m.def(
      "probe",
      [](std::optional<std::string> data_path, bool gpus) {
        if (data_path) {
          if (const std::string missing = MissingDataPlace(*data_path); !missing.empty()) {
            PyErr_SetObject(PyExc_FileNotFoundError,
                            py::make_tuple(ENOENT, "no such file or folder", missing).ptr());
            throw py::error_already_set();
          }
        }
        ProbeOptions o;
        o.data_path = std::move(data_path);
        o.skip_gpus = !gpus;
        MachineFacts facts;
        {
          py::gil_scoped_release release;
          facts = ProbeMachine(o);
        }
        return JsonToPython(FactsToJson(facts));
      },
      py::arg("data_path") = py::none(), py::arg("gpus") = false,
      "The machine facts as a dict (FactsToJson's form, see stoker/probe.h).");
  m.def(
      "rank_facts",
      [] {
        ProbeOptions o;
        o.skip_gpus = true;
        return JsonToPython(FactsToJson(ProbeMachine(o))["ranks"]);
      },
      "Where this process sits in a distributed job, from the launcher's environment "
      "(torchrun's RANK, WORLD_SIZE, ...).");
}

}  // namespace stoker::python
