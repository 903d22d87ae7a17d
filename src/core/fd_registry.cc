#include "core/fd_registry.h"

#include <unistd.h>

#include <atomic>

namespace stoker {
namespace {

// A lock-free table (fd + 1; 0 = empty), so that a child forked while another
// thread registers still reads a consistent copy.
constexpr int kMaxRegistered = 4096;
std::atomic<int> g_registered_fds[kMaxRegistered];

}  // namespace

void RegisterFd(int fd) {
  for (auto& slot : g_registered_fds) {
    int empty = 0;
    if (slot.compare_exchange_strong(empty, fd + 1)) return;
  }
}

void UnregisterFd(int fd) {
  for (auto& slot : g_registered_fds) {
    int expected = fd + 1;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

void CloseRegisteredFds(int keep) {
  for (auto& slot : g_registered_fds) {
    const int fd = slot.exchange(0) - 1;
    if (fd >= 0 && fd != keep) ::close(fd);
  }
}

}  // namespace stoker
