#include "core/clock.h"

#include <time.h>

#include <chrono>

namespace stoker {
namespace {

timespec Read(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return ts;
}

int64_t Nanos(const timespec& ts) { return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec; }

}  // namespace

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t ThreadCpuNanos() { return Nanos(Read(CLOCK_THREAD_CPUTIME_ID)); }

int64_t ProcessCpuNanos() { return Nanos(Read(CLOCK_PROCESS_CPUTIME_ID)); }

double ProcessCpuSeconds() {
  const timespec ts = Read(CLOCK_PROCESS_CPUTIME_ID);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace stoker
