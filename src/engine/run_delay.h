#pragma once

#include <cstdint>
#include <string_view>

#include "core/unique_fd.h"

namespace stoker {

/// The time the calling thread has spent runnable but waiting for a CPU: the
/// kernel's run-queue delay, from /proc/thread-self/schedstat. It tells a
/// worker queueing for a core (too many threads, or other processes' load)
/// apart from one waiting for I/O, which its wall time alone cannot.
/// Made on the thread it measures, and read there only. Where the kernel
/// keeps no such figure (no /proc, no schedstats), ReadNanos() returns -1.
class RunDelayClock {
 public:
  RunDelayClock();
  ~RunDelayClock();
  RunDelayClock(const RunDelayClock&) = delete;
  RunDelayClock& operator=(const RunDelayClock&) = delete;

  /// Cumulative nanoseconds since the thread started, or -1.
  int64_t ReadNanos() const;

 private:
  UniqueFd fd_;
};

/// The run-queue delay from schedstat's text ("<on-CPU ns> <run-queue ns>
/// <timeslices>"), or -1 when the text is not that.
int64_t ParseRunDelay(std::string_view schedstat);

}  // namespace stoker
