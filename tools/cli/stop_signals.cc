#include "stop_signals.h"

#include <signal.h>

#include <atomic>
#include <cassert>
#include <cstring>

namespace stoker::cli {
namespace {

std::atomic<int> g_received{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free store");
std::atomic<bool> g_installed{false};
struct sigaction g_previous_int;
struct sigaction g_previous_term;

extern "C" void RecordSignal(int signal) { g_received.store(signal, std::memory_order_relaxed); }

// A signal the process was started ignoring (a shell's background job
// ignores SIGINT) stays ignored.
void Install(int signal, const struct sigaction& action, struct sigaction& previous) {
  sigaction(signal, nullptr, &previous);
  if (previous.sa_handler != SIG_IGN) sigaction(signal, &action, nullptr);
}

}  // namespace

StopSignals::StopSignals() {
  [[maybe_unused]] const bool was = g_installed.exchange(true);
  assert(!was && "one StopSignals at a time");
  g_received.store(0);
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = RecordSignal;
  sigemptyset(&action.sa_mask);
  // SA_RESETHAND: the next one ends the process, should winding down hang.
  // SA_RESTART: other threads' system calls go on undisturbed.
  action.sa_flags = SA_RESETHAND | SA_RESTART;
  Install(SIGINT, action, g_previous_int);
  Install(SIGTERM, action, g_previous_term);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
  g_installed.store(false);
}

int StopSignals::received() const { return g_received.load(std::memory_order_relaxed); }

int ExitCodeFor(int signal) { return 128 + signal; }

const char* SignalName(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "signal";
  }
}

}  // namespace stoker::cli
