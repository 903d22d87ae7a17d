#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "command_output.h"
#include "commands.h"
#include "core/number_text.h"
#include "core/unique_fd.h"
#include "option_checks.h"
#include "pipeline.h"
#include "stoker/advisor.h"
#include "stoker/defaults.h"
#include "stoker/probe.h"
#include "stoker/report.h"
#include "stop_signals.h"

namespace stoker::cli {
namespace {

struct BenchFlags {
  PipelineFlags pipeline;
  double step_ms = 0;
  double point_seconds = 4.0;
  double tuned_seconds = 12.0;
  int max_workers = kMaxWorkers;
  std::string workers_list;
  std::string plot;
  bool json = false;
  bool no_gpus = false;
};

Result<std::vector<int>> ParseList(const std::string& text) {
  std::vector<int> out;
  // Every item between commas, the empty one after a trailing comma too
  // (std::getline drops it: "1," read as "1"); no text is no item.
  for (size_t start = 0; !text.empty() && start <= text.size();) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, end - start);
    std::optional<int> count = ParseCount(item);
    if (!count || *count > kMaxWorkers) {
      return InvalidArgument("expected worker counts from 0 to " + std::to_string(kMaxWorkers) +
                             " separated by commas, got '" + item + "'" +
                             (item == text ? "" : " in '" + text + "'"));
    }
    out.push_back(*count);
    start = end + 1;
  }
  STOKER_RETURN_IF_ERROR(CheckSweepCounts(out));
  return out;
}

// --plot's file, checked before the sweep; one this run made is removed
// again unless the plot was written, so that a failed run leaves no empty one.
class PlotFile {
 public:
  // An error: the path cannot be written (a fifo, a folder, a read-only place,
  // a folder that takes no new file beside it).
  Status Open(const std::string& path) {
    path_ = path;
    Result<bool> made = CheckReplaceable(path);
    made_ = made.ok() && *made;
    return made.status().WithContext("cannot write --plot " + path);
  }
  void Written() { made_ = false; }
  ~PlotFile() {
    if (made_) ::unlink(path_.c_str());
  }

 private:
  std::string path_;
  bool made_ = false;
};

// The options bench would ignore or contradict, refused as `stoker run`
// refuses those it would ignore: the sweep sets the worker count and its
// prefetch itself, and --max-workers bounds what it tries.
Status CheckBenchOptions(const BenchFlags& f, const std::vector<int>& sweep) {
  if (f.pipeline.workers != "auto") {
    return InvalidArgument(
        "--workers: bench measures worker counts itself; choose them with "
        "--sweep (e.g. --sweep " +
        f.pipeline.workers + ")");
  }
  if (f.pipeline.prefetch > 0) {
    return InvalidArgument(
        "--prefetch: bench runs each worker count with its default prefetch, and the tuner "
        "sets its own; measure a fixed prefetch with stoker run --workers N --prefetch P");
  }
  for (int w : sweep) {
    if (w > f.max_workers) {
      return InvalidArgument("--sweep " + std::to_string(w) + " is more than --max-workers " +
                             std::to_string(f.max_workers) + ", the largest count to try");
    }
  }
  return Status::Ok();
}

int RunBench(const BenchFlags& f) {
  SweepOptions so;
  if (!f.workers_list.empty()) {
    auto list = ParseList(f.workers_list);
    if (!list.ok()) return ReportError("bench", list.status().WithContext("--sweep"), f.json);
    so.workers = *list;
  }
  if (Status st = CheckBenchOptions(f, so.workers); !st.ok()) {
    return ReportError("bench", st, f.json);
  }
  // An unwritable --plot fails now, not after the whole sweep.
  PlotFile plot;
  if (!f.plot.empty()) {
    if (Status st = plot.Open(f.plot); !st.ok()) return ReportError("bench", st, f.json);
  }
  auto p = BuildPipeline(f.pipeline, f.json);
  if (!p.ok()) return ReportError("bench", p.status(), f.json);
  so.point_seconds = f.point_seconds;
  so.tuned_seconds = f.tuned_seconds;
  so.step_ms = f.step_ms;
  // I/O-bound data may want many times the core count; CPU-bound stops at the knee.
  so.max_workers = f.max_workers;
  // What is measured, named as the answer names it: stoker's own pipeline,
  // never a DataLoader over the user's Dataset.
  const std::string measured = std::string(LoaderKindName(LoaderKind::kNative)) +
                               " (stoker's native pipeline, C++ worker "
                               "threads)";
  if (!f.json) {
    std::cout << "stoker bench: " << measured << " over " << Printable(p->description) << ", batch "
              << f.pipeline.batch_size
              << (f.step_ms > 0 ? ", step " + FormatNumber(f.step_ms) + " ms" : "") << "\n";
    so.log = [](const std::string& line) { std::cout << line << "\n" << std::flush; };
  }
  // SIGINT and SIGTERM end the sweep, not the process: the points measured
  // so far are printed, as `stoker run` prints its partial summary. Output
  // that stdout no longer takes (its reader left) ends it too: nobody sees it.
  StopSignals signals;
  so.stop = StopEndingSlowReads(
      *p, [&signals] { return signals.received() != 0 || StdoutWriteError() != 0; });
  auto r = RunSweep(p->loader, so);
  if (!r.ok()) return ReportError("bench", NameFlags(r.status(), f.pipeline), f.json);
  // Nothing measured (stopped before the first count): no plot, and an
  // earlier one stays. A plot that cannot be written (a full disk) fails the
  // command, but after the results it would have drawn are printed.
  const bool plotting = !f.plot.empty() && !r->sweep.empty();
  Status plot_status;
  if (plotting) {
    plot_status = ReplaceFile(f.plot, SweepToSvg(*r, "stoker bench: " + p->description))
                      .WithContext("cannot write --plot " + f.plot);
    if (plot_status.ok()) plot.Written();
  }
  const bool plotted = plotting && plot_status.ok();
  const int signal = r->interrupted ? signals.received() : 0;
  // The answer for the loader measured, stoker's native pipeline, and no
  // other: the best static count and the prefetch it ran with (what kept the
  // consumer fed), not the tuned run's end state. A count for a DataLoader
  // over the user's own Dataset takes a sweep of that (stoker.bench).
  // A sweep stopped after one count compared it with nothing: no answer.
  const size_t measured_counts = r->sweep.size();
  std::optional<LoaderArgs> answer;
  std::string no_answer;
  if (measured_counts == 0 || (r->interrupted && measured_counts == 1)) {
    no_answer = "interrupted after " + std::to_string(measured_counts) +
                (measured_counts == 1 ? " count" : " counts") +
                ", nothing to compare; a whole sweep gives one";
  } else {
    ProbeOptions probe;
    probe.skip_gpus = f.no_gpus;
    const int gpus = static_cast<int>(ProbeMachine(probe).gpus.size());
    // The figures of the recommended count's row in the table.
    const SweepPoint& best = r->recommended;
    const SweepSubject subject{LoaderKind::kNative, p->description, f.pipeline.batch_size};
    answer = LoaderArgsFromSweep(subject, best.workers, best.samples_per_s, best.stall_fraction,
                                 DefaultPrefetch(best.workers, f.pipeline.batch_size), gpus);
    // The best of the counts measured, not of those the sweep would have tried.
    if (r->interrupted) {
      answer->basis += ", interrupted after " + std::to_string(measured_counts) + " counts";
    }
  }
  if (f.json) {
    nlohmann::json j = SweepToJson(*r);
    j["loader"] = LoaderKindName(LoaderKind::kNative);
    j["data"] = p->description;
    j["recommendation"] = answer ? LoaderArgsToJson(*answer) : nlohmann::json();
    j["no_recommendation"] = answer ? nlohmann::json() : nlohmann::json(no_answer);
    j["signal"] = signal != 0 ? nlohmann::json(SignalName(signal)) : nlohmann::json();
    j["plot"] = plotted ? nlohmann::json(f.plot) : nlohmann::json();
    j["plot_error"] = plot_status.ok() ? nlohmann::json() : nlohmann::json(plot_status.ToString());
    PrintJson(j);
  } else {
    std::cout << "\n" << FormatSweepTable(*r);
    if (plotted) std::cout << "plot written to " << f.plot << "\n";
    if (!f.plot.empty() && !plotting) std::cout << "no plot written: no count was measured\n";
    std::cout << "\n" << (answer ? answer->Text() : "no recommendation: " + no_answer + "\n");
    if (signal != 0) std::cout << "interrupted by " << SignalName(signal) << "\n";
  }
  // On stderr alone: stdout holds the results, whole (one JSON object with --json).
  if (!plot_status.ok()) return ReportError("bench", plot_status.ToString(), /*json=*/false);
  return signal != 0 ? ExitCodeFor(signal) : 0;
}

}  // namespace

void AddBenchCommand(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Sweep worker counts on your data and machine (samples/s per setting), then run "
      "the tuner and compare.");
  AddPipelineFlags(cmd, f->pipeline);
  // Kept to refuse them with advice (CheckBenchOptions), out of the help.
  cmd->get_option("--workers")->group("");
  cmd->get_option("--prefetch")->group("");
  cmd->add_option("--step-ms", f->step_ms, "simulated accelerator step per batch, ms")
      ->check(NumberIn(0, kMaxStepMs));
  cmd->add_option("--point-seconds", f->point_seconds, "measured seconds per sweep point")
      ->check(NumberIn(0.01, kMaxSeconds));
  cmd->add_option("--tuned-seconds", f->tuned_seconds, "seconds of the tuned run")
      ->check(NumberIn(0.1, kMaxSeconds));
  cmd->add_option(
         "--max-workers", f->max_workers,
         "largest worker count to try (default and at most " + std::to_string(kMaxWorkers) + ")")
      ->check(CountIn(1, kMaxWorkers));
  cmd->add_option("--sweep", f->workers_list, "worker counts to measure, e.g. 0,1,2,4,8")
      ->check(CLI::Validator(
          [](std::string& text) {
            auto list = ParseList(text);
            return list.ok() ? std::string() : list.status().message();
          },
          "LIST"));
  // The plot is SVG alone: a .png name would get SVG text no image viewer opens.
  cmd->add_option("--plot", f->plot,
                  "write an SVG of the sweep and the tuned run to FILE, whose name ends in .svg")
      ->check(PathGiven())
      ->check(CLI::Validator(
          [](std::string& path) {
            std::string extension = std::filesystem::path(path).extension().string();
            for (char& c : extension)
              c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            if (extension == ".svg") return std::string();
            return "the plot is SVG: expected a name ending in .svg, got '" + path + "'";
          },
          "FILE.svg"));
  cmd->add_flag("--no-gpus", f->no_gpus, "skip the NVML probe (pin_memory is then False)");
  cmd->add_flag("--json", f->json, "print JSON on stdout");
  cmd->callback([f, &exit_code] { exit_code = RunBench(*f); });
}

}  // namespace stoker::cli
