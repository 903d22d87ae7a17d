#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "stoker/source.h"
#include "stoker/status.h"

namespace stoker {

/// Fills `out` with the bytes of `fd` at `offset` (pread, retried on short
/// reads and EINTR). A file that ends before them was cut short after it was
/// opened: a DataError starting "truncated" that says its size now and the
/// bytes missing. Errors do not name the file: callers add it.
Status ReadFully(int fd, uint64_t offset, std::span<std::byte> out);

/// Reads the whole regular file at `path` into `buffer` and points `*bytes` at
/// it. `path` is a NUL-terminated byte string (any bytes but '/' and NUL per
/// component; no encoding assumed), resolved against the open directory
/// `dir_fd` when relative (AT_FDCWD for the working directory).
///
/// The read path is open + fstat + read of exactly the file's size into the
/// pooled buffer, then close. bench/read_bench.cc measured it against pread
/// (the same within noise), a read loop without fstat (the same) and mmap
/// (2-3x slower per small file: mapping, page faults and unmap every time,
/// and no way to keep a mapping alive with the ReadBuffer). `buffer` only
/// grows, so a warm buffer means no allocation.
///
/// Errors carry the failed step and the OS reason but not the path: callers
/// prefix their key (Status::WithContext). A missing file is NotFound; a
/// permission or other OS failure an IoError; something that is not a
/// regular file (a directory, a fifo: opened non-blocking, so never a hang)
/// or a file that shrinks while being read (ReadFully) a DataError. A zero-byte file is
/// read successfully as zero bytes. A file larger than buffer.cap is refused
/// from its fstat, unread: ResourceExhausted naming its size and the cap.
/// Blocks on I/O; safe to call concurrently with distinct buffers.
Status ReadWholeFile(int dir_fd, const char* path, ReadBuffer& buffer,
                     std::span<const std::byte>* bytes);

}  // namespace stoker
