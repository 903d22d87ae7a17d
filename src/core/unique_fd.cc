#include "core/unique_fd.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

namespace stoker {

Result<UniqueFd> OpenRegularFile(int dir_fd, const char* path, int flags, mode_t mode) {
  UniqueFd fd(::openat(dir_fd, path, flags | O_NONBLOCK | O_CLOEXEC, mode));
  if (!fd.valid()) {
    // A fifo opened for writing with no reader: refused below all the same.
    if (errno == ENXIO) return InvalidArgument("not a regular file");
    if (errno == ELOOP && (flags & O_NOFOLLOW) != 0) return InvalidArgument("a symbolic link");
    return ErrnoError("open", errno);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError("fstat", errno);
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgument(S_ISDIR(st.st_mode) ? "is a directory, not a file"
                                               : "not a regular file");
  }
  if (::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK) != 0) {
    return ErrnoError("fcntl", errno);
  }
  return fd;
}

}  // namespace stoker
