#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "bindings.h"
#include "stoker/probe.h"

namespace stoker::python {
namespace {

namespace py = pybind11;

py::object Optional(const std::optional<int>& v) { return v ? py::object(py::int_(*v)) : py::none(); }

}  // namespace

void BindMachine(py::module_& m) {
  m.def(
      "probe_json",
      [](std::optional<std::string> data_path, bool gpus) {
        ProbeOptions o;
        o.data_path = std::move(data_path);
        o.skip_gpus = !gpus;
        MachineFacts facts;
        {
          py::gil_scoped_release release;
          facts = ProbeMachine(o);
        }
        return FactsToJson(facts).dump();
      },
      py::arg("data_path") = py::none(), py::arg("gpus") = false,
      "The machine facts as a JSON string (see stoker/probe.h).");
  m.def(
      "rank_facts",
      [] {
        ProbeOptions o;
        o.skip_gpus = true;
        MachineFacts::Ranks r = ProbeMachine(o).ranks;
        py::dict d;
        d["rank"] = Optional(r.rank);
        d["local_rank"] = Optional(r.local_rank);
        d["world_size"] = Optional(r.world_size);
        d["local_world_size"] = Optional(r.local_world_size);
        d["launcher"] = r.launcher;
        return d;
      },
      "Where this process sits in a distributed job, from the launcher's environment "
      "(torchrun's RANK, WORLD_SIZE, ...).");
}

}  // namespace stoker::python
