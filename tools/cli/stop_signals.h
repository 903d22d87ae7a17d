#pragma once

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

}  // namespace stoker::cli
