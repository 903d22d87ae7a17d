#include "source/file_reader.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "core/unique_fd.h"

namespace stoker {

Status ReadWholeFile(int dir_fd, const char* path, ReadBuffer& buffer,
                     std::span<const std::byte>* bytes) {
  // O_NONBLOCK: a fifo named like an image must not block the worker in
  // open(); for regular files it changes nothing.
  UniqueFd file(::openat(dir_fd, path, O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!file.valid()) return ErrnoError("open", errno);
  const int fd = file.get();
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("fstat", errno);
  if (!S_ISREG(st.st_mode)) {
    return DataError(S_ISDIR(st.st_mode) ? "is a directory, not a file" : "not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (buffer.bytes.size() < size) buffer.bytes.resize(size);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd, buffer.bytes.data() + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read", errno);
    }
    if (n == 0) {
      return DataError("file shrank while being read: " + std::to_string(done) + " of " +
                       std::to_string(size) + " bytes");
    }
    done += static_cast<size_t>(n);
  }
  *bytes = std::span<const std::byte>(buffer.bytes.data(), size);
  return Status::Ok();
}

}  // namespace stoker
