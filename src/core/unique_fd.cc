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

namespace {

// A new file of its own (O_EXCL) beside `path`, or beside the file a symbolic
// link there names, created 0666 less the umask as any create.
struct Beside {
  UniqueFd fd;
  std::string temp;    // the new file
  std::string target;  // what a rename over it replaces
};

Result<Beside> CreateBeside(const std::string& path) {
  Beside out;
  out.target = path;
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    char real[PATH_MAX];
    if (::realpath(path.c_str(), real) == nullptr) return ErrnoError("resolve the link", errno);
    out.target = real;
  }
  const size_t slash = out.target.rfind('/');
  const std::string dir =
      slash == std::string::npos ? std::string() : out.target.substr(0, slash + 1);
  static std::atomic<uint64_t> made{0};
  while (!out.fd.valid()) {
    out.temp = dir + ".stoker-write-" + std::to_string(::getpid()) + "-" + std::to_string(made++);
    out.fd.reset(::open(out.temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
    if (!out.fd.valid() && errno != EEXIST) return ErrnoError("create a file beside it", errno);
  }
  return out;
}

}  // namespace

Result<bool> CheckReplaceable(const std::string& path) {
  struct stat st;
  const bool made = ::stat(path.c_str(), &st) != 0;
  // Appending leaves a file that is there untouched until it is replaced.
  Result<UniqueFd> fd = OpenRegularFile(AT_FDCWD, path.c_str(), O_WRONLY | O_CREAT | O_APPEND);
  if (!fd.ok()) return fd.status();
  Result<Beside> beside = CreateBeside(path);
  if (!beside.ok()) {
    if (made) ::unlink(path.c_str());
    return beside.status();
  }
  ::unlink(beside->temp.c_str());
  return made;
}

Status ReplaceFile(const std::string& path, std::string_view contents) {
  Result<Beside> beside = CreateBeside(path);
  if (!beside.ok()) return beside.status();
  UniqueFd& fd = beside->fd;
  const std::string& temp = beside->temp;
  const std::string& target = beside->target;
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
