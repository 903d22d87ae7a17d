#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

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
                << f->pipeline.batch_size << " every " << f->step_ms
                << " ms (the simulated accelerator step);\nthe tuner looks for the fewest "
                   "workers that keep it from ever waiting.\n\n";
    }
    auto s = RunJob(*f);
    if (!s.ok()) {
      exit_code = ReportError("demo", s.status(), f->json);
      return;
    }
    if (s->signal != 0) exit_code = ExitCodeFor(s->signal);
    if (f->json) {
      PrintJson(RunSummaryToJson(*s));
      return;
    }
    std::cout << "\n" << s->description << "\n";
    PrintRunSummary(*s, std::cout);
    if (s->signal != 0) return;  // asked to stop: the summary is enough
    const double demand = f->step_ms > 0 ? 1000.0 / f->step_ms * f->pipeline.batch_size : 0;
    char stall[32];
    std::snprintf(stall, sizeof stall, "%.2f", s->stats.stall_fraction * 100);
    std::cout << "\nWhat the tuner found: the consumer takes about " << static_cast<int>(demand)
              << " samples/s; " << s->workers_final << " worker"
              << (s->workers_final == 1 ? "" : "s") << " kept it waiting " << stall
              << " % of the time (the decisions above say why).\n"
              << "Try --step-ms 0 (a consumer as fast as possible), --read-latency-ms 5 (slow "
                 "storage), or `stoker bench` for the samples/s per worker table.\n";
  });
}

}  // namespace stoker::cli
