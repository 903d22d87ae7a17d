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
  // A fifo named like an image must not block the worker in open().
  Result<UniqueFd> file = OpenRegularFile(dir_fd, path, O_RDONLY);
  if (!file.ok()) {
    const Status& st = file.status();
    return st.code() == StatusCode::kInvalidArgument ? DataError(st.message())
                                                     : st;  // the sample's
  }
  const int fd = file->get();
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError("fstat", errno);
  if (!buffer.cap.Allows(static_cast<uint64_t>(st.st_size))) {
    return buffer.cap.Refuse("a file of this size", static_cast<uint64_t>(st.st_size),
                             "reading it");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (buffer.bytes.size() < size) buffer.bytes.resize(size);
  STOKER_RETURN_IF_ERROR(ReadFully(fd, 0, {buffer.bytes.data(), size}));
  *bytes = std::span<const std::byte>(buffer.bytes.data(), size);
  return Status::Ok();
}

Status ReadFully(int fd, uint64_t offset, std::span<std::byte> out) {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n =
        ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("read of bytes [" + std::to_string(offset) + ", " +
                            std::to_string(offset + out.size()) + ")",
                        errno);
    }
    if (n == 0) {
      struct stat st;
      const std::string now =
          ::fstat(fd, &st) == 0 ? " (" + std::to_string(st.st_size) + " bytes now)" : "";
      return DataError("truncated: the file was cut short since it was opened" + now +
                       " and no longer holds bytes [" + std::to_string(offset) + ", " +
                       std::to_string(offset + out.size()) + ")");
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace stoker
