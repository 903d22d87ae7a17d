#include "stop_signals.h"

#include <signal.h>
#include <time.h>

#include <atomic>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

namespace stoker::cli {
namespace {

std::atomic<int> g_received{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler needs a lock-free store");
std::atomic<int64_t> g_first_ns{0};  // CLOCK_MONOTONIC of the first signal; 0: none yet
static_assert(std::atomic<int64_t>::is_always_lock_free, "the handler needs a lock-free store");
std::atomic<bool> g_installed{false};
struct sigaction g_previous_int;
struct sigaction g_previous_term;

// Signals this soon after the first are that stop sent again: `timeout`, a
// job scheduler or a container runtime signals the process and its group.
constexpr int64_t kRepeatGraceNs = 1'000'000'000;

// Async-signal-safe: atomics, clock_gettime, sigaction and raise only.
extern "C" void RecordSignal(int signal) {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const int64_t ns = int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec + 1;  // never 0
  int64_t first = 0;
  if (g_first_ns.compare_exchange_strong(first, ns, std::memory_order_relaxed)) {
    g_received.store(signal, std::memory_order_relaxed);
    return;
  }
  if (ns - first < kRepeatGraceNs) return;
  // A second stop, while winding down: the signal's default action ends the
  // process (delivered once this handler returns).
  struct sigaction fallback;
  std::memset(&fallback, 0, sizeof fallback);
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  sigaction(signal, &fallback, nullptr);
  raise(signal);
}

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
  g_first_ns.store(0);
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = RecordSignal;
  // One handler at a time: a SIGTERM inside a SIGINT's handler waits for it.
  sigemptyset(&action.sa_mask);
  sigaddset(&action.sa_mask, SIGINT);
  sigaddset(&action.sa_mask, SIGTERM);
  // SA_RESTART: other threads' system calls go on undisturbed.
  action.sa_flags = SA_RESTART;
  Install(SIGINT, action, g_previous_int);
  Install(SIGTERM, action, g_previous_term);
}

StopSignals::~StopSignals() {
  sigaction(SIGINT, &g_previous_int, nullptr);
  sigaction(SIGTERM, &g_previous_term, nullptr);
  g_installed.store(false);
}

int StopSignals::received() const { return g_received.load(std::memory_order_relaxed); }

namespace {

// What Interrupted attaches: the signal, for the exit code.
struct SignalDetail final : StatusDetail {
  explicit SignalDetail(int s) : signal(s) {}
  const int signal;
};

}  // namespace

Status Interrupted(int signal) {
  return Cancelled(std::string("interrupted by ") + SignalName(signal))
      .WithDetail(std::make_shared<const SignalDetail>(signal));
}

int InterruptedBy(const Status& status) {
  const auto* detail = dynamic_cast<const SignalDetail*>(status.detail().get());
  return detail != nullptr ? detail->signal : 0;
}

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
