#pragma once

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <string>
#include <string_view>
#include <utility>

#include "stoker/status.h"

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

/// Opens `path` (relative to `dir_fd`, or AT_FDCWD) with `flags` and keeps it
/// only if it is a regular file. Opened with O_NONBLOCK, cleared after, so a
/// fifo or a device named by the user never blocks the open (a fifo opened
/// for writing with no reader fails at once). Errors name no path (callers
/// add it): ErrnoError("open"), or kInvalidArgument "not a regular file" /
/// "is a directory, not a file" / "a symbolic link" (with O_NOFOLLOW).
Result<UniqueFd> OpenRegularFile(int dir_fd, const char* path, int flags, mode_t mode = 0644);

/// Writes `contents` to a new file beside `path` (the file a symbolic link
/// names, for a link) and renames it over `path`: a full disk, an error or a
/// kill mid-write leaves the file that was there whole, never a cut one. The
/// new file's mode is 0666 less the umask, as a plain create's. Errors name
/// no path (callers add it).
Status ReplaceFile(const std::string& path, std::string_view contents);

/// What ReplaceFile(path) needs, checked before long work: `path` opens as a
/// regular file (created if missing; a file there is left untouched) and its
/// folder takes a new file beside it. True when `path` was created here: an
/// empty file the caller removes if the work fails. Errors name no path.
Result<bool> CheckReplaceable(const std::string& path);

}  // namespace stoker
