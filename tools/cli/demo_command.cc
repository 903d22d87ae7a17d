#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "command_output.h"
#include "commands.h"
#include "pipeline.h"
#include "stop_signals.h"

namespace stoker::cli {

// The README's main job: the built-in data set (made on first use), the
// ImageNet training pipeline, a simulated accelerator step, the tuner on.
void AddDemoCommand(CLI::App& app, int& exit_code) {
  auto f = std::make_shared<RunFlags>();
  f->step_ms = 250;  // about a ResNet-50 step on a mid-range GPU at batch 64
  f->seconds = 20;
  CLI::App* cmd = app.add_subcommand(
      "demo",
      "Make the built-in data set if missing, then run the tuned loader on it and explain "
      "what the tuner found.");
  AddRunFlags(cmd, *f);
  cmd->callback([f, &exit_code] {
    if (!f->json) {
      std::cout << "stoker demo: a stand-in training loop takes a batch of "
                << f->pipeline.batch_size;
      if (f->step_ms > 0) {
        std::cout << " every " << f->step_ms << " ms (the simulated accelerator step)";
      } else {
        std::cout << " as soon as it comes (no accelerator step)";
      }
      std::cout << ";\nthe tuner looks for the fewest workers that keep it from ever waiting.\n\n";
    }
    auto s = RunJob(*f);
    if (!s.ok()) {
      exit_code = ReportError("demo", s.status(), f->json);
      return;
    }
    if (s->signal != 0) exit_code = ExitCodeFor(s->signal);
    if (f->json) {
      PrintJson(RunSummaryToJson(*s));
      exit_code = ReportTraceError("demo", *s, exit_code);
      return;
    }
    std::cout << "\n" << s->description << "\n";
    PrintRunSummary(*s, std::cout);
    if (s->signal != 0) {  // asked to stop: the summary is enough
      exit_code = ReportTraceError("demo", *s, exit_code);
      return;
    }
    // The wait at the count the run ended with: the trailing stretch of the
    // timeline at that count, not the whole run's (start-up, other counts).
    const auto& timeline = s->stats.timeline;
    size_t from = timeline.size();
    while (from > 0 && timeline[from - 1].workers == s->workers_final) --from;
    double waited = 0;
    for (size_t i = from; i < timeline.size(); ++i) waited += timeline[i].stall_fraction;
    const size_t held = timeline.size() - from;
    const double held_s =
        held == 0 ? 0 : timeline.back().t_s - (from > 0 ? timeline[from - 1].t_s : 0);
    char line[256];
    if (held > 0) {
      std::snprintf(line, sizeof line,
                    "%d worker%s, the count it ended with, kept it waiting %.2f %% of the time "
                    "over the last %.1f s (%.2f %% over the whole run, start-up included)",
                    s->workers_final, s->workers_final == 1 ? "" : "s", waited / held * 100, held_s,
                    s->stats.stall_fraction * 100);
    } else {
      std::snprintf(line, sizeof line,
                    "it ended at %d worker%s; the consumer waited %.2f %% of the whole run",
                    s->workers_final, s->workers_final == 1 ? "" : "s",
                    s->stats.stall_fraction * 100);
    }
    // With no step the consumer takes whatever comes: there is no demand to
    // state, and --step-ms 0 is no option left to try.
    const bool stepped = f->step_ms > 0;
    const std::string demand =
        stepped
            ? "takes about " +
                  std::to_string(static_cast<int>(1000.0 / f->step_ms * f->pipeline.batch_size)) +
                  " samples/s"
            : "takes each batch as soon as it comes (no step)";
    std::cout << "\nWhat the tuner found: the consumer " << demand << "; " << line
              << ". The decisions above say why.\n"
              << "Try " << (stepped ? "--step-ms 0 (a consumer as fast as possible), " : "")
              << "--read-latency-ms 5 (slow storage), or `stoker bench` for the samples/s per "
                 "worker table.\n";
    exit_code = ReportTraceError("demo", *s, exit_code);
  });
}

}  // namespace stoker::cli
