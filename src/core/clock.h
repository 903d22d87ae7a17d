#pragma once

#include <cstdint>

// Clocks the engine, the tuner, sources and reports read. All are safe to call
// from any thread and never fail (Linux clocks that always exist).

namespace stoker {

/// Monotonic wall time in nanoseconds since an unspecified start
/// (std::chrono::steady_clock): only differences mean anything.
int64_t SteadyNanos();

/// CPU time the calling thread has used, in nanoseconds (user + system).
int64_t ThreadCpuNanos();

/// CPU time all threads of the process have used, in nanoseconds.
int64_t ProcessCpuNanos();

/// ProcessCpuNanos() in seconds.
double ProcessCpuSeconds();

}  // namespace stoker
