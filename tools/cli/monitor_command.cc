#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "command_output.h"
#include "commands.h"
#include "option_checks.h"
#include "stoker/json_text.h"
#include "stoker/report.h"
#include "stoker/tuning.h"
#include "stop_signals.h"

namespace stoker::cli {
namespace {

struct MonitorOptions {
  double interval_s = 1.0;
  uint64_t count = 0;  // 0: until stopped
  bool once = false;
  bool json = false;
};

// Local time of day, "10:42:07".
std::string Clock() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char text[16];
  std::strftime(text, sizeof text, "%H:%M:%S", &tm);
  return text;
}

int RunMonitor(const MonitorOptions& o) {
  const uint64_t count = o.once ? 1 : o.count;
  const bool tty = !o.json && isatty(STDOUT_FILENO) != 0;
  StopSignals signals;
  for (uint64_t shown = 0; count == 0 || shown < count; ++shown) {
    if (shown > 0) {
      // Sleeps the interval in short steps so that Ctrl-C ends it at once.
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(o.interval_s));
      while (signals.received() == 0 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    if (signals.received() != 0) {
      if (tty) std::cout << "\n" << std::flush;  // the shell's prompt on a line of its own
      return ExitCodeFor(signals.received());
    }
    Result<NodeLoaders> node = ReadNodeLoaders();
    if (!node.ok()) return ReportError("monitor", node.status(), o.json);
    if (o.json) {
      nlohmann::json j = NodeLoadersToJson(*node);
      j["time_s"] =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      // One object per line while it repeats (JSON Lines); one object, indented, once.
      if (count == 1) {
        PrintJson(j);
      } else {
        std::cout << DumpJson(j) << "\n";
      }
    } else {
      if (tty && count != 1)
        std::cout << "\033[H\033[2J";  // redraw in place (a single view stays in the scrollback)
      else if (shown > 0)
        std::cout << "\n";
      std::cout << "stoker monitor " << Clock() << "\n"
                << FormatNodeLoaders(*node, tty ? TerminalColumns(stdout) : 0);
    }
    std::cout.flush();
    if (StdoutWriteError() != 0) return kExitFailed;  // a reader gone: FinishOutput says so
  }
  return 0;
}

}  // namespace

void AddMonitorCommand(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<MonitorOptions>();
  CLI::App* cmd = app.add_subcommand(
      "monitor",
      "Watch the stoker loaders running on this machine (this user's): workers, prefetch, "
      "samples/s, stall, CPU and share of the node, refreshed live until Ctrl-C.");
  cmd->add_option("--interval", opts->interval_s, "seconds between refreshes")
      ->check(NumberIn(0.1, 3600));
  CLI::Option* count = cmd->add_option("--count", opts->count,
                                       "stop after this many refreshes (default: until Ctrl-C)")
                           ->check(CountIn(1, kMaxEpochs));
  cmd->add_flag("--once", opts->once, "print one view and exit (as --count 1)")->excludes(count);
  cmd->add_flag("--json", opts->json,
                "print JSON on stdout: one object with --once, else one object per line");
  cmd->callback([opts, &exit_code] { exit_code = RunMonitor(*opts); });
}

}  // namespace stoker::cli
