#pragma once

#include <unistd.h>

#include <utility>

namespace stoker {

/// Owns a file descriptor and closes it on destruction, so that every return
/// path of a function that opened it closes it. Move-only; -1 means "none".
/// Not thread-safe: one owner uses it at a time, like the descriptor itself.
class UniqueFd {
 public:
  UniqueFd() = default;
  /// Takes ownership of `fd` (may be -1, as a failed open() returns).
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }

  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  /// The descriptor, still owned; -1 when none.
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

  /// Gives up ownership without closing: the caller (or, say, fdopendir) now
  /// owns the descriptor. Leaves this empty.
  int release() { return std::exchange(fd_, -1); }

  /// Closes the owned descriptor (if any) and owns `fd` instead.
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

  /// Closes now and returns close()'s result (0, or -1 with errno set), for
  /// writers that must report a failed close. 0 when none was owned.
  int Close() {
    const int fd = release();
    return fd < 0 ? 0 : ::close(fd);
  }

 private:
  int fd_ = -1;
};

}  // namespace stoker
