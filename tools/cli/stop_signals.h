#pragma once

#include <functional>
#include <utility>

#include "stoker/status.h"

namespace stoker::cli {

/// Turns SIGINT and SIGTERM into a request to stop, for the life of the
/// object: the handler only stores the signal's number in a lock-free atomic
/// (async-signal-safe), and the run loop polls received() and winds down,
/// printing its partial summary. A second SIGINT or SIGTERM while winding
/// down ends the process as usual, once it comes a second or more after the
/// first: sooner, it is the same stop sent twice (`timeout`, schedulers and
/// container runtimes signal the process and its group). A signal the
/// process was started ignoring stays ignored. The destructor puts the
/// previous handlers back.
///
/// At most one StopSignals at a time (asserted); construct and destroy it on
/// one thread. received() is safe from any thread.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  /// SIGINT or SIGTERM once one arrived, else 0.
  int received() const;
};

/// The conventional exit code of a run ended by `signal`: 128 + its number
/// (130 for SIGINT, 143 for SIGTERM).
int ExitCodeFor(int signal);

/// "SIGINT" or "SIGTERM" (any other: "signal").
const char* SignalName(int signal);

/// kCancelled "interrupted by SIGINT" carrying `signal`: a step that a stop
/// signal ended with nothing to summarise (the making of a data set).
/// ReportError exits with ExitCodeFor(signal) on it.
Status Interrupted(int signal);

/// The signal an Interrupted status carries (context added since too), else 0.
int InterruptedBy(const Status& status);

/// Runs `work(stop)`, a step that asks `stop` between its pieces and fails
/// when it says true, with SIGINT and SIGTERM turned into that stop (see
/// StopSignals): its error after a signal is Interrupted(signal).
template <typename Work>
auto StoppedBySignals(Work&& work) -> decltype(work(std::function<bool()>())) {
  StopSignals signals;
  auto result = std::forward<Work>(work)(
      std::function<bool()>([&signals] { return signals.received() != 0; }));
  if (!result.ok() && signals.received() != 0) return Interrupted(signals.received());
  return result;
}

}  // namespace stoker::cli
