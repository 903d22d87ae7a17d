#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "command_output.h"
#include "commands.h"
#include "option_checks.h"
#include "pipeline.h"
#include "stoker/probe.h"
#include "stoker/report.h"
#include "stoker/sweep.h"
#include "stop_signals.h"

namespace stoker::cli {

Result<RunSummary> RunJob(const RunFlags& f) {
  STOKER_ASSIGN_OR_RETURN(Pipeline p, BuildPipeline(f.pipeline, f.quiet));
  // An option the run would ignore is refused: each is for one of the modes.
  const bool tuned = p.loader.workers == kAutoWorkers;
  if (!f.trace.empty() && !tuned) {
    return InvalidArgument(
        "--trace records the tuner's decisions, which it makes only with "
        "--workers auto");
  }
  if (f.pipeline.prefetch > 0 && tuned) {
    return InvalidArgument(
        "--prefetch is for a fixed --workers count: with --workers auto the "
        "tuner sets the depth");
  }
  p.loader.tuner.trace_path = f.trace;
  if (!f.quiet) std::cerr << "stoker run: " << Printable(p.description) << "\n";
  auto made = Loader::Make(p.loader);
  if (!made.ok()) return NameFlags(made.status(), f.pipeline);
  std::unique_ptr<Loader> loader = std::move(*made);
  LiveView view(stderr);
  ConsumeOptions co;
  co.seconds = f.seconds;
  co.cut_at_limit = true;  // --seconds S: the run lasts S, not S and a batch or a step
  co.epochs = f.seconds > 0 ? f.epochs : std::max<int64_t>(f.epochs, 1);
  co.step_ms = f.step_ms;
  const int64_t per_epoch = loader->batches_per_epoch();
  Loader* l = loader.get();
  // --gpu-util: NVML's figures beside the stall, sampled at most once a
  // second (PCIe throughput takes NVML ~20 ms a direction to measure).
  std::unique_ptr<GpuSampler> gpus;
  if (f.gpu_util && !f.quiet) {
    auto opened = GpuSampler::Open();
    if (opened.ok()) {
      gpus = std::move(*opened);
    } else {
      std::cerr << "stoker run: " << Printable(opened.status().message()) << "\n";
    }
  }
  std::string gpu_columns;
  double gpu_sampled_s = -1e9;
  if (!f.quiet) {
    co.on_point = [&, l, per_epoch](const TimelinePoint& pt) {
      if (gpus != nullptr && pt.t_s - gpu_sampled_s >= 1.0) {
        gpu_columns = GpuColumns(gpus->Sample(/*pcie=*/true));
        gpu_sampled_s = pt.t_s;
      }
      LoaderMetrics m = l->Metrics();
      char progress[64];
      std::snprintf(
          progress, sizeof progress, "epoch %lld %3lld%%", static_cast<long long>(l->epoch()),
          static_cast<long long>(per_epoch ? (m.batches_delivered % per_epoch) * 100 / per_epoch
                                           : 0));
      auto tv = l->tuner_view();
      view.Update(pt, progress, tv && tv->last_decision ? tv->last_decision->reason : "",
                  tv ? NodeViewText(tv->node) : "", gpu_columns);
    };
  }
  // From here on SIGINT and SIGTERM end the loop, not the process: the
  // summary of what ran is printed. Before it there is nothing to summarise.
  StopSignals signals;
  co.stop = StopEndingSlowReads(p, [&signals] { return signals.received() != 0; });
  auto stats = Consume(*loader, co);
  // A loop that --seconds ended need not wait out its workers' simulated
  // reads either (a summary ten seconds late, with --read-latency-ms 10000).
  if (p.slow != nullptr) p.slow->Cancel();
  if (!f.quiet) view.Finish();
  if (!stats.ok()) return stats.status();
  RunSummary s;
  // --trace asked for the decisions on disk: a run that could not write them
  // (a full disk) failed, though its loop ran and its summary is printed.
  s.trace_status = loader->FlushTrace();
  s.description = p.description;
  s.stats = *stats;
  s.workers_final = loader->workers();
  s.skipped = loader->Skipped();
  s.skipped_count = loader->Metrics().samples_skipped;
  s.trace = loader->tuner_trace();
  s.view = loader->tuner_view();
  s.peak_rss_bytes = PeakRssBytes();
  if (stats->stopped) s.signal = signals.received();
  return s;
}

nlohmann::json RunSummaryToJson(const RunSummary& s) {
  nlohmann::json skipped = nlohmann::json::array();
  for (const auto& r : s.skipped) skipped.push_back(SkipRecordToJson(r));
  // Each with its reason, as the human view and bench --json give them.
  nlohmann::json decisions = nlohmann::json::array();
  for (const auto& d : s.trace) decisions.push_back(TunerDecisionToJson(d));
  return {{"samples", s.stats.samples},
          {"seconds", s.stats.seconds},
          {"samples_per_s", s.stats.seconds > 0 ? s.stats.samples / s.stats.seconds : 0},
          {"stall_fraction", s.stats.stall_fraction},
          {"workers_final", s.workers_final},
          {"workers_max", std::max(s.stats.workers_max, s.workers_final)},
          {"decisions", decisions},
          {"peak_rss_bytes", s.peak_rss_bytes},
          {"skipped", s.skipped_count},
          {"skipped_samples", skipped},
          {"epochs_completed", s.stats.epochs_completed},
          {"interrupted", s.signal != 0},
          {"signal", s.signal != 0 ? nlohmann::json(SignalName(s.signal)) : nlohmann::json()},
          {"trace_error",
           s.trace_status.ok() ? nlohmann::json() : nlohmann::json(s.trace_status.ToString())},
          // A point every 0.25 s: the rate once settled, without the start-up
          // that "samples_per_s" includes.
          {"timeline", TimelineToJson(s.stats.timeline)}};
}

void PrintRunSummary(const RunSummary& s, std::ostream& out) {
  const double rate = s.stats.seconds > 0 ? s.stats.samples / s.stats.seconds : 0;
  char line[256];
  std::snprintf(line, sizeof line,
                "  %lld samples in %.1f s: %.0f samples/s, consumer waited %.2f %% of the time\n",
                static_cast<long long>(s.stats.samples), s.stats.seconds, rate,
                s.stats.stall_fraction * 100);
  out << line;
  std::snprintf(line, sizeof line, "  workers: %d at the end, %d at most; peak RSS %zu MiB\n",
                s.workers_final, std::max(s.stats.workers_max, s.workers_final),
                s.peak_rss_bytes >> 20);
  out << line;
  if (s.signal != 0) out << "  interrupted by " << SignalName(s.signal) << "\n";
  if (!s.skipped.empty()) {
    out << "  skipped " << s.skipped_count << " samples:\n"
        << FormatSkipped(s.skipped, s.skipped_count, "    ");
  }
  if (!s.trace.empty()) {
    out << "  tuner decisions (" << s.trace.size() << "):\n";
    for (const auto& d : s.trace) {
      std::snprintf(line, sizeof line, "    %6.1fs  workers %3d -> %-3d  ", d.t_s, d.workers_before,
                    d.workers_after);
      out << line << d.reason << "\n";
    }
  }
}

int ReportTraceError(const std::string& command, const RunSummary& s, int exit_code) {
  if (s.trace_status.ok()) return exit_code;
  // On stderr alone: stdout holds the summary, whole (one JSON object with --json).
  return ReportError(command, s.trace_status.ToString(), /*json=*/false);
}

void AddRunFlags(CLI::App* cmd, RunFlags& f) {
  AddPipelineFlags(cmd, f.pipeline);
  cmd->add_option("--step-ms", f.step_ms,
                  "simulated accelerator step per batch, ms (0 = as fast as possible)")
      ->check(NumberIn(0, kMaxStepMs));
  cmd->add_option("--seconds", f.seconds, "run this long (0: no time limit)")
      ->check(NumberIn(0, kMaxSeconds));
  // 0 epochs is refused, as --batch-size 0 is: it never meant a run of none.
  cmd->add_option("--epochs", f.epochs,
                  "run this many epochs (default: 1 without --seconds, as many as fit with it)")
      ->check(CountIn(1, kMaxEpochs));
  cmd->add_option("--trace", f.trace, "append the tuner's decisions to FILE as JSON lines")
      ->check(PathGiven());
  cmd->add_flag("--json", f.json, "print the summary as JSON on stdout");
  CLI::Option* quiet = cmd->add_flag("--quiet", f.quiet, "no live view");
  // Shown in the live view alone: with --quiet it would be ignored, unsaid.
  cmd->add_flag("--gpu-util", f.gpu_util,
                "show GPU utilisation, memory and PCIe throughput (NVML) in the live view")
      ->excludes(quiet);
}

void AddRunCommand(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Feed a stand-in training loop from a data set, with the tuner choosing workers.");
  AddRunFlags(cmd, *f);
  cmd->callback([f, &exit_code] {
    auto s = RunJob(*f);
    if (!s.ok()) {
      exit_code = ReportError("run", s.status(), f->json);
      return;
    }
    if (s->signal != 0) exit_code = ExitCodeFor(s->signal);
    if (f->json) {
      PrintJson(RunSummaryToJson(*s));
    } else {
      std::cout << "stoker run: " << Printable(s->description) << "\n";
      PrintRunSummary(*s, std::cout);
    }
    exit_code = ReportTraceError("run", *s, exit_code);
  });
}

}  // namespace stoker::cli
