// The sweep's report (table, SVG plot), the count it recommends and the
// answer it supports (the advisor's LoaderArgs), for stoker.bench: a sweep measured in Python is
// shown and answered exactly as `stoker bench` shows and answers its own.
#include <pybind11/stl.h>

#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "core/unique_fd.h"
#include "errors.h"
#include "stoker/advisor.h"
#include "stoker/report.h"
#include "stoker/sweep.h"

namespace py = pybind11;

namespace stoker::python {
namespace {

// (workers, samples/s, stall fraction) per point; the best is the point
// with `best_workers` (the caller's choice, as RunSweep makes its own).
using PointTuple = std::tuple<int, double, double>;

SweepReport StaticSweep(const std::vector<PointTuple>& points, int best_workers) {
  SweepReport r;
  for (const auto& [workers, rate, stall] : points) {
    r.sweep.push_back({workers, rate, stall});
    if (workers == best_workers) r.best_static = r.recommended = r.sweep.back();
  }
  if (r.best_static.workers != best_workers) {
    throw py::value_error("best_workers " + std::to_string(best_workers) +
                          " is not one of the points' worker counts");
  }
  return r;
}

}  // namespace

void BindSweepReport(py::module_& m) {
  m.def(
      "recommended_workers",
      [](const std::vector<PointTuple>& points) {
        if (points.empty()) throw py::value_error("recommended_workers needs at least one point");
        std::vector<SweepPoint> sweep;
        for (const auto& [workers, rate, stall] : points) sweep.push_back({workers, rate, stall});
        return RecommendedSweepPoint(sweep).workers;
      },
      py::arg("points"),
      "The count a sweep of (workers, samples/s, stall fraction) points recommends: "
      "RecommendedSweepPoint, the rule `stoker bench` answers with (the fewest workers within "
      "3 % of the highest samples/s).");
  m.def(
      "check_sweep_counts",
      [](const std::vector<int>& counts) { ThrowIfError(CheckSweepCounts(counts)); },
      py::arg("counts"),
      "CheckSweepCounts: the rule `stoker bench --sweep` holds its counts to (ValueError).");
  m.def(
      "sweep_table",
      [](const std::vector<PointTuple>& points, int best_workers) {
        return FormatSweepTable(StaticSweep(points, best_workers));
      },
      py::arg("points"), py::arg("best_workers"),
      "The table `stoker bench` prints, for a static sweep (no tuned run).");
  m.def(
      "write_sweep_svg",
      [](const std::vector<PointTuple>& points, int best_workers, const std::string& title,
         const std::string& path) {
        const std::string svg = SweepToSvg(StaticSweep(points, best_workers), title);
        py::gil_scoped_release unlocked;
        ThrowIfError(ReplaceFile(path, svg).WithContext("cannot write plot " + path));
      },
      py::arg("points"), py::arg("best_workers"), py::arg("title"), py::arg("path"),
      "Writes the SVG plot `stoker bench --plot` writes, for a static sweep, to `path` as it "
      "does: whole, renamed over the file there (OSError naming it).");
  m.def(
      "check_replaceable",
      [](const std::string& path, const std::string& what) {
        Result<bool> made = CheckReplaceable(path);
        if (!made.ok()) {
          // OSError whatever the cause, as an open() of the path would raise.
          const std::string text = made.status().WithContext(what + " " + path).message();
          PyErr_SetString(PyExc_OSError, text.c_str());
          throw py::error_already_set();
        }
        return *made;
      },
      py::arg("path"), py::arg("what"),
      "CheckReplaceable: whether write_sweep_svg will be able to write `path`, checked before "
      "the sweep as `stoker bench --plot` checks it; True when this made `path` (empty). "
      "OSError starting with `what` and the path otherwise.");
  m.def(
      "loader_args_from_sweep",
      [](const std::string& kind, const std::string& data, int64_t batch_size, int best_workers,
         double samples_per_s, double stall_fraction, int prefetch_batches, int gpus) {
        if (kind != "torch" && kind != "stoker") {
          throw py::value_error("kind must be 'torch' or 'stoker', got '" + kind + "'");
        }
        const SweepSubject subject{
            kind == "torch" ? LoaderKind::kTorchDataLoader : LoaderKind::kStokerDataLoader, data,
            batch_size};
        const LoaderArgs args = LoaderArgsFromSweep(subject, best_workers, samples_per_s,
                                                    stall_fraction, prefetch_batches, gpus);
        nlohmann::json j = LoaderArgsToJson(args);
        j["text"] = args.Text();
        return JsonToPython(j);
      },
      py::arg("kind"), py::arg("data"), py::arg("batch_size"), py::arg("best_workers"),
      py::arg("samples_per_s"), py::arg("stall_fraction"), py::arg("prefetch_batches"),
      py::arg("gpus"),
      "LoaderArgsFromSweep for the DataLoader a sweep measured (kind 'torch': "
      "torch.utils.data.DataLoader, 'stoker': stoker.DataLoader) over `data`, as a dict: "
      "loader, measured, basis, num_workers, prefetch_factor, pin_memory, persistent_workers, "
      "line, rules, note, and text (what `stoker bench` prints for its own).");
}

}  // namespace stoker::python
