#include "core/unique_fd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>

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

Status ReplaceFile(const std::string& path, std::string_view contents) {
  std::string target = path;
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    char real[PATH_MAX];
    if (::realpath(path.c_str(), real) == nullptr) return ErrnoError("resolve the link", errno);
    target = real;
  }
  const size_t slash = target.rfind('/');
  const std::string dir = slash == std::string::npos ? std::string() : target.substr(0, slash + 1);
  // A name of its own (O_EXCL), created 0666 less the umask as any create.
  static std::atomic<uint64_t> made{0};
  std::string temp;
  UniqueFd fd;
  while (!fd.valid()) {
    temp = dir + ".stoker-write-" + std::to_string(::getpid()) + "-" + std::to_string(made++);
    fd.reset(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
    if (!fd.valid() && errno != EEXIST) return ErrnoError("create a file beside it", errno);
  }
  auto fail = [&](const char* what) {
    const int err = errno;
    ::unlink(temp.c_str());
    return ErrnoError(what, err);
  };
  for (size_t done = 0; done < contents.size();) {
    const ssize_t n = ::write(fd.get(), contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("write");
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) return fail("fsync");
  if (fd.Close() != 0) return fail("close");
  if (::rename(temp.c_str(), target.c_str()) != 0) return fail("rename");
  return Status::Ok();
}

}  // namespace stoker
