#include "engine/run_delay.h"

#include <fcntl.h>
#include <unistd.h>

#include <charconv>

#include "core/fd_registry.h"

namespace stoker {

RunDelayClock::RunDelayClock() : fd_(::open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC)) {
  if (fd_.valid() && ReadNanos() < 0) fd_.reset();
  // A plain fork() keeps it (O_CLOEXEC acts at exec only): a zygote closes it.
  if (fd_.valid()) RegisterFd(fd_.get());
}

RunDelayClock::~RunDelayClock() {
  if (fd_.valid()) UnregisterFd(fd_.get());
}

int64_t RunDelayClock::ReadNanos() const {
  if (!fd_.valid()) return -1;
  char buf[128];
  // The kernel renders the file afresh on each read from offset 0.
  const ssize_t n = ::pread(fd_.get(), buf, sizeof buf, 0);
  return n > 0 ? ParseRunDelay(std::string_view(buf, static_cast<size_t>(n))) : -1;
}

int64_t ParseRunDelay(std::string_view s) {
  auto field = [&s](int64_t* v) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
    if (ec != std::errc() || *v < 0) return false;
    s.remove_prefix(static_cast<size_t>(end - s.data()));
    return true;
  };
  int64_t on_cpu = 0, delay = 0, slices = 0;
  if (!field(&on_cpu) || !field(&delay) || !field(&slices)) return -1;
  return delay;
}

}  // namespace stoker
