#include "source/tar_shard.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cctype>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "core/unique_fd.h"
#include "source/file_reader.h"
#include "source/label_text.h"

namespace stoker {
namespace {

constexpr size_t kBlock = 512;
// Largest size an 11-digit octal field holds: 8 GiB - 1.
constexpr uint64_t kMaxOctalSize = 077777777777ull;

// Field offsets and widths of a ustar header.
constexpr size_t kNameOff = 0, kNameLen = 100;
constexpr size_t kModeOff = 100, kUidOff = 108, kGidOff = 116, kIdLen = 8;
constexpr size_t kSizeOff = 124, kSizeLen = 12;
constexpr size_t kMtimeOff = 136, kMtimeLen = 12;
constexpr size_t kChksumOff = 148, kChksumLen = 8;
constexpr size_t kTypeOff = 156;
constexpr size_t kMagicOff = 257;
constexpr size_t kPrefixOff = 345, kPrefixLen = 155;
// An old GNU sparse header's flag: more of its map follows in a block (whose
// own flag is at kGnuSparseMoreOff).
constexpr size_t kGnuSparseExtendedOff = 482, kGnuSparseMoreOff = 504;

uint64_t RoundUpToBlock(uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

// ---------------------------------------------------------------- writing

// Writes `value` as zero-padded octal digits filling `width - 1` bytes, then
// a NUL. REQUIRES: the value fits.
void PutOctal(char* field, size_t width, uint64_t value) {
  for (size_t i = width - 1; i-- > 0;) {
    field[i] = static_cast<char>('0' + (value & 7));
    value >>= 3;
  }
  field[width - 1] = '\0';
}

// Fills `header` for `member`, or says why the member cannot be written.
Status MakeHeader(const TarMember& member, char (&header)[kBlock]) {
  const std::string& name = member.name;
  if (name.empty()) return InvalidArgument("tar member with an empty name");
  if (name.find('\0') != std::string::npos) {
    return InvalidArgument("tar member name contains a NUL byte: '" + name + "'");
  }
  if (member.data.size() > kMaxOctalSize) {
    return InvalidArgument("tar member '" + name + "' is " + std::to_string(member.data.size()) +
                           " bytes; ustar holds at most " + std::to_string(kMaxOctalSize));
  }
  std::string_view prefix, base = name;
  if (name.size() > kNameLen) {
    // Split at a '/' so that the part before fits the prefix field and the
    // part after fits the name field; prefer the longest prefix.
    size_t split = std::string::npos;
    for (size_t i = std::min(name.size() - 1, kPrefixLen); i > 0; --i) {
      if (name[i] == '/' && name.size() - i - 1 <= kNameLen && name.size() - i - 1 > 0) {
        split = i;
        break;
      }
    }
    if (split == std::string::npos) {
      return InvalidArgument("tar member name is too long for ustar (" +
                             std::to_string(name.size()) +
                             " bytes, no '/' splits it into <= 155 + <= 100): '" + name + "'");
    }
    prefix = std::string_view(name).substr(0, split);
    base = std::string_view(name).substr(split + 1);
  }
  std::memset(header, 0, kBlock);
  std::memcpy(header + kNameOff, base.data(), base.size());
  if (!prefix.empty()) std::memcpy(header + kPrefixOff, prefix.data(), prefix.size());
  PutOctal(header + kModeOff, kIdLen, 0644);
  PutOctal(header + kUidOff, kIdLen, 0);
  PutOctal(header + kGidOff, kIdLen, 0);
  PutOctal(header + kSizeOff, kSizeLen, member.data.size());
  PutOctal(header + kMtimeOff, kMtimeLen, 0);
  header[kTypeOff] = '0';
  std::memcpy(header + kMagicOff,
              "ustar\0"
              "00",
              8);
  std::memset(header + kChksumOff, ' ', kChksumLen);
  unsigned sum = 0;
  for (char c : header) sum += static_cast<unsigned char>(c);
  PutOctal(header + kChksumOff, 7, sum);  // six digits and a NUL...
  header[kChksumOff + 7] = ' ';           // ...then a space, as tar(1) writes
  return Status::Ok();
}

// Writes all of [data, data + size) to `fd`, retrying short writes.
Status WriteAll(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(path + ": write", errno);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Buffers small writes so that a shard of many small members costs few
// system calls; large data goes straight from the caller's memory.
class ShardWriter {
 public:
  ShardWriter(int fd, const std::string& path) : fd_(fd), path_(path) { buffer_.reserve(kCap); }

  Status Append(const void* data, size_t size) {
    if (size >= kCap / 4) {
      STOKER_RETURN_IF_ERROR(Flush());
      return WriteAll(fd_, data, size, path_);
    }
    if (buffer_.size() + size > kCap) STOKER_RETURN_IF_ERROR(Flush());
    const char* p = static_cast<const char*>(data);
    buffer_.insert(buffer_.end(), p, p + size);
    return Status::Ok();
  }

  Status Flush() {
    Status s = WriteAll(fd_, buffer_.data(), buffer_.size(), path_);
    buffer_.clear();
    return s;
  }

 private:
  static constexpr size_t kCap = size_t{1} << 20;
  int fd_;
  const std::string& path_;
  std::vector<char> buffer_;
};

Status WriteMembers(int fd, const std::string& path, std::span<const TarMember> members) {
  static const char kZeros[kBlock * 2] = {};
  ShardWriter out(fd, path);
  for (const TarMember& member : members) {
    char header[kBlock];
    STOKER_RETURN_IF_ERROR(MakeHeader(member, header).WithContext(path));
    STOKER_RETURN_IF_ERROR(out.Append(header, kBlock));
    STOKER_RETURN_IF_ERROR(out.Append(member.data.data(), member.data.size()));
    size_t pad = RoundUpToBlock(member.data.size()) - member.data.size();
    STOKER_RETURN_IF_ERROR(out.Append(kZeros, pad));
  }
  STOKER_RETURN_IF_ERROR(out.Append(kZeros, sizeof(kZeros)));
  return out.Flush();
}

// ---------------------------------------------------------------- reading

std::string_view Field(const std::byte* header, size_t offset, size_t width) {
  const char* p = reinterpret_cast<const char*>(header) + offset;
  const void* nul = std::memchr(p, '\0', width);
  return std::string_view(p, nul ? static_cast<const char*>(nul) - p : width);
}

// Parses a numeric header field: octal digits between optional spaces and a
// NUL/space terminator, or GNU base-256 (high bit of the first byte set).
// An all-blank field is 0. Returns nothing for anything else.
std::optional<uint64_t> ParseNumber(const std::byte* header, size_t offset, size_t width) {
  const auto* p = reinterpret_cast<const unsigned char*>(header) + offset;
  if (p[0] & 0x80) {
    if (p[0] != 0x80) return std::nullopt;  // negative, or more than 63 bits
    uint64_t value = 0;
    for (size_t i = 1; i < width; ++i) {
      if (value >> 55) return std::nullopt;
      value = (value << 8) | p[i];
    }
    if (value >> 63) return std::nullopt;
    return value;
  }
  size_t i = 0;
  while (i < width && p[i] == ' ') ++i;
  uint64_t value = 0;
  for (; i < width && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (value >> 60) return std::nullopt;
    value = value * 8 + (p[i] - '0');
  }
  for (; i < width; ++i) {
    if (p[i] != ' ' && p[i] != '\0') return std::nullopt;
  }
  return value;
}

bool IsZeroBlock(const std::byte* block, size_t size) {
  return std::all_of(block, block + size, [](std::byte b) { return b == std::byte{0}; });
}

// The compressor whose magic number `head` starts with, or nullptr: a shard
// compressed whole (shard.tar.gz) is not a tar stoker can index.
const char* CompressedKind(std::span<const std::byte> head) {
  struct Magic {
    const char* kind;
    std::string_view bytes;
  };
  static constexpr Magic kMagics[] = {{"gzip", std::string_view("\x1f\x8b", 2)},
                                      {"bzip2", "BZh"},
                                      {"xz", std::string_view("\xfd"
                                                              "7zXZ\0",
                                                              6)},
                                      {"zstd", std::string_view("\x28\xb5\x2f\xfd", 4)},
                                      {"zip", std::string_view("PK\x03\x04", 4)}};
  for (const Magic& m : kMagics) {
    if (head.size() >= m.bytes.size() &&
        std::memcmp(head.data(), m.bytes.data(), m.bytes.size()) == 0) {
      return m.kind;
    }
  }
  return nullptr;
}

bool ChecksumMatches(const std::byte* header) {
  std::optional<uint64_t> stored = ParseNumber(header, kChksumOff, kChksumLen);
  if (!stored) return false;
  // Some old writers summed signed chars; accept either sum.
  int64_t unsigned_sum = 0, signed_sum = 0;
  for (size_t i = 0; i < kBlock; ++i) {
    bool in_field = i >= kChksumOff && i < kChksumOff + kChksumLen;
    auto byte = static_cast<unsigned char>(header[i]);
    unsigned_sum += in_field ? ' ' : byte;
    signed_sum += in_field ? ' ' : static_cast<signed char>(byte);
  }
  return static_cast<int64_t>(*stored) == unsigned_sum ||
         static_cast<int64_t>(*stored) == signed_sum;
}

// Reads the records of a pax extended header ("<len> <key>=<value>\n") and
// keeps the two that change how the next member is read.
// GNU.sparse.* records (any of GNU tar's pax sparse formats) set `*sparse`;
// GNU.sparse.name is then the member's own name (its path is a stand-in).
Status ParsePax(std::string_view data, std::optional<std::string>* path,
                std::optional<uint64_t>* size, bool* sparse, const std::string& where) {
  std::optional<std::string> sparse_name;
  while (!data.empty()) {
    if (data.front() == '\0') break;  // padding some writers leave
    size_t space = data.find(' ');
    if (space == std::string_view::npos || space == 0 || space > 20) {
      return DataError(where + ": malformed pax record length");
    }
    uint64_t len = 0;
    for (char c : data.substr(0, space)) {
      if (c < '0' || c > '9') return DataError(where + ": malformed pax record length");
      len = len * 10 + static_cast<uint64_t>(c - '0');
    }
    if (len <= space + 1 || len > data.size() || data[len - 1] != '\n') {
      return DataError(where + ": pax record length " + std::to_string(len) + " is out of range");
    }
    std::string_view record = data.substr(space + 1, len - space - 2);
    data.remove_prefix(len);
    size_t eq = record.find('=');
    if (eq == std::string_view::npos) return DataError(where + ": pax record without '='");
    std::string_view key = record.substr(0, eq), value = record.substr(eq + 1);
    if (key == "path") {
      *path = std::string(value);
    } else if (key == "size") {
      uint64_t v = 0;
      if (value.empty() || value.size() > 19) return DataError(where + ": bad pax size");
      for (char c : value) {
        if (c < '0' || c > '9') return DataError(where + ": bad pax size");
        v = v * 10 + static_cast<uint64_t>(c - '0');
      }
      *size = v;
    } else if (key.starts_with("GNU.sparse.")) {
      *sparse = true;
      if (key == "GNU.sparse.name") sparse_name = std::string(value);
    }
  }
  if (sparse_name) *path = std::move(sparse_name);
  return Status::Ok();
}

// Where the indexer reads an archive from: bytes in memory (IndexTarBytes,
// the fuzzer's entry point) or a shard file (pread). Both give the indexer
// copies, so that it never holds a pointer into a file that may shrink.
class ArchiveReader {
 public:
  virtual ~ArchiveReader() = default;
  virtual uint64_t size() const = 0;
  // Fills `out` with the bytes at `offset`. REQUIRES: they lie within size().
  // Errors name the byte range, not the archive: callers add it.
  virtual Status ReadAt(uint64_t offset, std::span<std::byte> out) = 0;
};

class SpanReader final : public ArchiveReader {
 public:
  explicit SpanReader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  uint64_t size() const override { return bytes_.size(); }
  Status ReadAt(uint64_t offset, std::span<std::byte> out) override {
    assert(offset <= bytes_.size() && out.size() <= bytes_.size() - offset);
    std::memcpy(out.data(), bytes_.data() + offset, out.size());
    return Status::Ok();
  }

 private:
  std::span<const std::byte> bytes_;
};

// Reads a shard file for indexing: headers are small and mostly close
// together (a label's header, its block, the image's header), so reads go
// through a small window that usually serves several headers per pread.
class FileReader final : public ArchiveReader {
 public:
  FileReader(int fd, uint64_t size) : fd_(fd), size_(size) {}
  uint64_t size() const override { return size_; }
  Status ReadAt(uint64_t offset, std::span<std::byte> out) override {
    assert(offset <= size_ && out.size() <= size_ - offset);
    if (offset >= window_offset_ && offset - window_offset_ + out.size() <= window_.size()) {
      std::memcpy(out.data(), window_.data() + (offset - window_offset_), out.size());
      return Status::Ok();
    }
    if (out.size() >= kWindow) return ReadFully(fd_, offset, out);
    window_.resize(static_cast<size_t>(std::min<uint64_t>(kWindow, size_ - offset)));
    window_offset_ = offset;
    Status s = ReadFully(fd_, offset, window_);
    if (!s.ok()) {
      window_.clear();
      return s;
    }
    std::memcpy(out.data(), window_.data(), out.size());
    return Status::Ok();
  }

 private:
  static constexpr size_t kWindow = 8 * kBlock;
  int fd_;
  uint64_t size_;
  uint64_t window_offset_ = 0;
  std::vector<std::byte> window_;
};

// Reads an archive's regular-file members one at a time, in order: the core
// of IndexTarBytes, and of the tar stream, which groups members as they come.
class TarScanner {
 public:
  // `archive` and `what` must outlive the scanner.
  TarScanner(ArchiveReader& archive, const std::string& what) : archive_(archive), what_(what) {}

  // The next regular-file member, or nothing at the end-of-archive block.
  // Errors as IndexTarBytes says. REQUIRES: no error or end returned before.
  Result<std::optional<TarEntry>> Next() {
    // A GNU long name or a pax header is read into memory; past this size it
    // is garbage, not a name.
    constexpr uint64_t kMaxMetaBytes = uint64_t{1} << 20;
    std::byte block[kBlock];
    const std::byte* header = block;
    const uint64_t end = archive_.size();
    while (pos_ < end) {
      const uint64_t here = pos_;
      auto at = [&] { return what_ + ": at byte " + std::to_string(here); };
      const size_t have = static_cast<size_t>(std::min<uint64_t>(kBlock, end - pos_));
      STOKER_RETURN_IF_ERROR(archive_.ReadAt(pos_, {block, have}).WithContext(what_));
      // A compressed shard, however short, is named by its compressor.
      if (const char* kind = here == 0 ? CompressedKind(std::span(block, have)) : nullptr) {
        return DataError(what_ + ": a " + kind +
                         "-compressed file, not a tar: stoker reads uncompressed tar shards "
                         "(decompress it first)");
      }
      if (have < kBlock) {
        return DataError(at() + ": truncated tar: a header of " + std::to_string(have) +
                         " of 512 bytes" + AfterLast());
      }
      if (IsZeroBlock(header, kBlock)) return std::optional<TarEntry>();  // end of archive
      if (!ChecksumMatches(header)) {
        return DataError(at() + ": bad tar header checksum (not a tar file, or corrupt)");
      }
      std::optional<uint64_t> header_size = ParseNumber(header, kSizeOff, kSizeLen);
      if (!header_size) return DataError(at() + ": malformed size field in tar header");
      const char type = static_cast<char>(header[kTypeOff]);
      const bool posix = Field(header, kMagicOff, 6) == "ustar";  // GNU has "ustar  "
      // Meta entries describe the next real entry; their own names are noise,
      // and they must not use up a long name meant for that entry.
      const bool is_meta = type == 'L' || type == 'K' || type == 'x' || type == 'g';
      std::string name;
      if (!is_meta && long_name_) {
        name = std::move(*long_name_);
        long_name_.reset();
      } else if (!is_meta) {
        std::string_view prefix = posix ? Field(header, kPrefixOff, kPrefixLen) : "";
        std::string_view base = Field(header, kNameOff, kNameLen);
        name = prefix.empty() ? std::string(base) : std::string(prefix) + "/" + std::string(base);
      }
      const uint64_t size = (!is_meta && pax_size_) ? *pax_size_ : *header_size;
      if (!is_meta) pax_size_.reset();
      const bool sparse = type == 'S' || (!is_meta && pax_sparse_);
      if (!is_meta) pax_sparse_ = false;

      uint64_t data = pos_ + kBlock;
      // An old GNU sparse member's map may go on in extension blocks (their
      // flag at 482 in the header, then at 504 in each) before its data.
      for (bool more = type == 'S' && header[kGnuSparseExtendedOff] != std::byte{0}; more;) {
        std::byte extension[kBlock];
        if (end - data < kBlock) return DataError(at() + ": truncated GNU sparse header");
        STOKER_RETURN_IF_ERROR(archive_.ReadAt(data, extension).WithContext(what_));
        more = extension[kGnuSparseMoreOff] != std::byte{0};
        data += kBlock;
      }
      // Link, device, directory and fifo entries carry no data whatever their
      // size field says; everything else (regular files, unknown types) does.
      const bool has_data = !(type >= '1' && type <= '6');
      if (has_data && size > end - data) {
        return DataError(at() + ": truncated tar member '" + name + "': needs " +
                         std::to_string(size) + " bytes, " + std::to_string(end - data) +
                         " remain");
      }
      if (type == 'L' || type == 'x') {
        if (size > kMaxMetaBytes) {
          return DataError(at() + ": " + (type == 'L' ? "GNU long name" : "pax header") + " of " +
                           std::to_string(size) + " bytes (at most " +
                           std::to_string(kMaxMetaBytes) + ")");
        }
        content_.resize(static_cast<size_t>(size));
        STOKER_RETURN_IF_ERROR(
            archive_.ReadAt(data, std::as_writable_bytes(std::span(content_))).WithContext(what_));
      }
      pos_ = has_data ? data + RoundUpToBlock(size) : data;
      switch (type) {
        case 'L': {
          size_t nul = content_.find('\0');
          long_name_ = content_.substr(0, nul);
          break;
        }
        case 'x':
          STOKER_RETURN_IF_ERROR(ParsePax(content_, &long_name_, &pax_size_, &pax_sparse_, at()));
          break;
        case '0':
        case '\0':
        case '7':
        case 'S':
          // Old (pre-POSIX) archives mark directories by a trailing '/'.
          if (!(type == '\0' && !name.empty() && name.back() == '/')) {
            last_name_ = name;
            any_ = true;
            return std::optional<TarEntry>(TarEntry{std::move(name), data, size, sparse});
          }
          break;
        case '1':
        case '2':  // named, so that a sample whose image is one says so
          return std::optional<TarEntry>(TarEntry{std::move(name), data, 0, true});
        default:
          break;  // 'K' long link names, 'g' global pax, dirs, unknown
      }
    }
    // A tar ends with zero blocks. Without one it was cut short, perhaps right
    // after a member, and members may be missing: an error, never fewer samples.
    return DataError(what_ + ": truncated tar: it ends at byte " + std::to_string(end) +
                     AfterLast() + ", without the end-of-archive blocks");
  }

 private:
  std::string AfterLast() const {
    return any_ ? " after member '" + last_name_ + "'" : std::string(" before any file member");
  }

  ArchiveReader& archive_;
  const std::string& what_;
  uint64_t pos_ = 0;                      // of the next header
  std::optional<std::string> long_name_;  // from a GNU 'L' or pax 'path'
  std::optional<uint64_t> pax_size_;
  bool pax_sparse_ = false;  // the pax header named a GNU sparse member
  std::string content_;      // of the last meta entry
  std::string last_name_;
  bool any_ = false;  // whether a member was returned
};

Result<std::vector<TarEntry>> IndexTar(ArchiveReader& archive, const std::string& what) {
  TarScanner scanner(archive, what);
  std::vector<TarEntry> entries;
  while (true) {
    STOKER_ASSIGN_OR_RETURN(std::optional<TarEntry> entry, scanner.Next());
    if (!entry) return entries;
    if (!entry->unread) entries.push_back(std::move(*entry));
  }
}

}  // namespace

Status WriteTarShard(const std::string& path, std::span<const TarMember> members) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoError(path + ": open for writing", errno);
  Status status = WriteMembers(fd.get(), path, members);
  if (fd.Close() != 0 && status.ok()) status = ErrnoError(path + ": close", errno);
  if (!status.ok()) ::unlink(path.c_str());
  return status;
}

Result<std::vector<TarEntry>> IndexTarBytes(std::span<const std::byte> bytes,
                                            const std::string& what) {
  SpanReader reader(bytes);
  return IndexTar(reader, what);
}

std::pair<std::string_view, std::string_view> SplitSampleKey(std::string_view member_name) {
  size_t base = member_name.rfind('/');
  base = base == std::string_view::npos ? 0 : base + 1;
  size_t dot = member_name.find('.', base);
  if (dot == std::string_view::npos) return {member_name, {}};
  return {member_name.substr(0, dot), member_name.substr(dot + 1)};
}

namespace {

// ---------------------------------------------------------------- the source

// Shard files held open by every tar source in the process. They stay under
// half the soft RLIMIT_NOFILE, leaving the rest to the process (a WebDataset
// ImageNet has 1282 shards; the usual soft limit is 1024); shards past that
// are reopened for each read.
std::atomic<int64_t> g_held_shard_fds{0};

bool ReserveHeldShardFd() {
  struct rlimit limit;
  int64_t budget = 512;
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    budget = limit.rlim_cur == RLIM_INFINITY
                 ? std::numeric_limits<int64_t>::max()
                 : static_cast<int64_t>(std::min<rlim_t>(limit.rlim_cur / 2, INT64_MAX));
  }
  if (g_held_shard_fds.fetch_add(1, std::memory_order_relaxed) < budget) return true;
  g_held_shard_fds.fetch_sub(1, std::memory_order_relaxed);
  return false;
}

// One shard file, read with pread: a file cut short under the reader is a
// short read and an error, where a mapping of it raised SIGBUS. Reads see the
// file that was opened even when a new one is renamed over its path: the
// descriptor stays open for the file's life, or, for a source past the
// descriptor budget, each read reopens the path and checks it is still that
// file.
class ShardFile {
 public:
  // Opens the shard at `path`, holding its descriptor (outside the budget)
  // until KeepOpenWithinBudget. Errors name the path.
  static Result<std::unique_ptr<ShardFile>> Open(const std::string& path) {
    Result<UniqueFd> fd = OpenRegularFile(AT_FDCWD, path.c_str(), O_RDONLY);
    if (!fd.ok()) return fd.status().WithContext(path + ": tar shard");
    struct stat st;
    if (::fstat(fd->get(), &st) != 0) return ErrnoError(path + ": stat tar shard", errno);
    return std::unique_ptr<ShardFile>(new ShardFile(path, st, std::move(*fd)));
  }

  ~ShardFile() {
    if (counted_) g_held_shard_fds.fetch_sub(1, std::memory_order_relaxed);
  }
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  const std::string& path() const { return path_; }

  // The file as it was opened, for the tar scanner. REQUIRES: the descriptor
  // is still held, and stays so while the reader is used.
  FileReader Scan() const {
    assert(fd_.valid());
    return FileReader(fd_.get(), size_);
  }

  // For a source that keeps the shard for its life: keeps the descriptor
  // while all tar sources together stay within the budget, else closes it,
  // and reads reopen the path.
  void KeepOpenWithinBudget() {
    assert(!counted_);
    if (ReserveHeldShardFd()) {
      counted_ = true;
    } else {
      fd_.reset();
    }
  }

  // Fills `out` with the bytes at `offset`. Errors do not name the shard:
  // callers add the key. Safe to call concurrently.
  Status ReadAt(uint64_t offset, std::span<std::byte> out) const {
    if (fd_.valid()) return ReadFully(fd_.get(), offset, out);
    // Not blocking on a fifo put in its place: the identity check refuses it.
    UniqueFd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    if (!fd.valid()) return ErrnoError("reopen tar shard", errno);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return ErrnoError("stat tar shard", errno);
    if (st.st_dev != dev_ || st.st_ino != ino_) {
      return DataError("the tar shard was replaced by another file since it was opened");
    }
    return ReadFully(fd.get(), offset, out);
  }

 private:
  ShardFile(std::string path, const struct stat& st, UniqueFd fd)
      : path_(std::move(path)),
        dev_(st.st_dev),
        ino_(st.st_ino),
        size_(static_cast<uint64_t>(st.st_size)),
        fd_(std::move(fd)) {}

  std::string path_;
  // The file opened, to recognise it when reopening.
  dev_t dev_;
  ino_t ino_;
  uint64_t size_;         // when opened
  UniqueFd fd_;           // invalid: reopened per read
  bool counted_ = false;  // in g_held_shard_fds
};

// Where one sample's members lie in its shard. 40 bytes a sample.
struct TarSample {
  uint64_t image_offset = 0;
  uint64_t cls_offset = 0;
  uint64_t name_offset = 0;  // of the image member's name in the name arena
  uint32_t image_size = 0;
  uint32_t cls_size = kNoCls;
  uint32_t shard = 0;
  uint32_t name_size = 0;

  static constexpr uint32_t kNoCls = std::numeric_limits<uint32_t>::max();
  // image_size of a labelled sample with no image stoker decodes: its name
  // is then of the member it has instead (x.webp), else of its label.
  static constexpr uint32_t kNoImage = std::numeric_limits<uint32_t>::max();
};

constexpr std::string_view kImageExtensions = ".jpg, .jpeg, .png";
// Said where two members' names share a key that their writer meant apart.
constexpr std::string_view kKeyRule =
    " (a sample's key ends at the first '.' of the member's file name, as WebDataset's)";

// Whether `ext` is `lower` in any case.
bool ExtensionIs(std::string_view ext, std::string_view lower) {
  return ext.size() == lower.size() &&
         std::equal(ext.begin(), ext.end(), lower.begin(),
                    [](char c, char w) { return (c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c) == w; });
}

bool IsImageExtension(std::string_view ext) {
  return ExtensionIs(ext, "jpg") || ExtensionIs(ext, "jpeg") || ExtensionIs(ext, "png");
}

// What a member is decoded as: the last part of its extension, as
// WebDataset's decoders read it ("seg.png" is a png, "CLS" a label).
std::string_view MemberKind(std::string_view ext) {
  const size_t dot = ext.rfind('.');
  return dot == std::string_view::npos ? ext : ext.substr(dot + 1);
}

// Groups one shard's members into samples as they come, for the source and
// the stream alike. Samples are in the order of their keys' first image or
// label member. A sample key with two images or two labels (a member
// written twice, or a.jpg beside a.png) is an error naming the shard and the
// key: keeping one would drop the other without a word, and which label
// belongs to which image cannot be told. A key with a label but no image
// stoker decodes (a.cls beside a.webp, or alone) is a sample whose read
// fails naming it, so it is reported (or skipped and recorded), never lost
// unseen; so is a key whose only image- or label-like members are other
// fields (img.004.jpg, img.004.cls: key "img"). Members of a key with no
// label (a.json, a.txt) are not samples.
class SampleGrouper {
 public:
  // Samples get `shard_number`, and their names go into `names` (the name
  // arena); errors name `path`. Both must outlive the grouper.
  SampleGrouper(const std::string& path, uint32_t shard_number, std::string& names)
      : path_(path), shard_number_(shard_number), names_(names) {}

  // Takes the shard's next member.
  Status Add(TarEntry entry) {
    const auto [key, ext] = SplitSampleKey(entry.name);
    const bool image = IsImageExtension(ext) && !entry.unread;
    const bool cls = ExtensionIs(ext, "cls") && !entry.unread;
    if (entry.unread && (IsImageExtension(ext) || ExtensionIs(ext, "cls"))) {
      // The key's sample, or its stray one, is named after it (UnreadMember).
      const std::string& kept = members_.emplace_back(std::move(entry.name));
      const std::string_view kept_key = SplitSampleKey(kept).first;
      other_member_.insert_or_assign(kept_key, kept);
      stray_member_.insert_or_assign(kept_key, kept);
      return Status::Ok();
    }
    if (!image && !cls) {
      // Named like an image or a label of another field ("img.004.jpg": key
      // "img", field "004.jpg"): remembered, so a key left with no sample
      // is reported, not dropped unseen.
      const std::string_view kind = MemberKind(ext);
      const bool stray = IsImageExtension(kind) || ExtensionIs(kind, "cls");
      if (!other_member_.contains(key) || (stray && !stray_member_.contains(key))) {
        const std::string& kept = members_.emplace_back(std::move(entry.name));
        const std::string_view kept_key = SplitSampleKey(kept).first;
        other_member_.try_emplace(kept_key, kept);
        if (stray) stray_member_.try_emplace(kept_key, kept);
      }
      return Status::Ok();
    }
    if (entry.size >= TarSample::kNoCls) {
      return DataError(path_ + ": member '" + entry.name + "' is too large (" +
                       std::to_string(entry.size) + " bytes; at most 4 GiB)");
    }
    // Members of a sample are usually adjacent, but nothing requires it: the
    // map keeps every key of the shard, its views into members_.
    const std::string& name = members_.emplace_back(std::move(entry.name));
    const std::string_view stable_key = SplitSampleKey(name).first;
    auto [it, inserted] = by_key_.try_emplace(stable_key, pending_.size());
    if (inserted) {
      pending_.emplace_back();
      pending_.back().shard = shard_number_;
      has_image_.push_back(false);
      label_name_.emplace_back();
    }
    const size_t i = it->second;
    TarSample& s = pending_[i];
    if ((image && has_image_[i]) || (cls && s.cls_size != TarSample::kNoCls)) {
      const std::string first =
          cls ? std::string(label_name_[i]) : names_.substr(s.name_offset, s.name_size);
      return DataError(path_ + ": duplicate sample key '" + std::string(stable_key) + "': " +
                       (first == name ? "member '" + first + "' appears twice"
                        : image       ? "two images, '" + first + "' and '" + name + "'"
                                      : "two labels, '" + first + "' and '" + name + "'") +
                       (first == name ? "" : std::string(kKeyRule)));
    }
    if (image) {
      has_image_[i] = true;
      s.image_offset = entry.offset;
      s.image_size = static_cast<uint32_t>(entry.size);
      s.name_offset = names_.size();
      s.name_size = static_cast<uint32_t>(name.size());
      names_ += name;
    } else {
      s.cls_offset = entry.offset;
      s.cls_size = static_cast<uint32_t>(entry.size);
      label_name_[i] = name;
    }
    while (ready_ < pending_.size() && has_image_[ready_] &&
           pending_[ready_].cls_size != TarSample::kNoCls) {
      ++ready_;
    }
    return Status::Ok();
  }

  // After the shard's last member: names each key with a label but no image
  // after the member it has instead, else after its label; adds a sample
  // (neither image nor label) for each key with only stray members, named
  // after one. All samples are then ready.
  void Finish() {
    for (const auto& [key, name] : stray_member_) {
      if (by_key_.contains(key)) continue;
      TarSample& s = pending_.emplace_back();
      s.shard = shard_number_;
      s.image_size = TarSample::kNoImage;
      s.name_offset = names_.size();
      s.name_size = static_cast<uint32_t>(name.size());
      names_ += name;
      has_image_.push_back(false);
      label_name_.emplace_back();
    }
    for (size_t i = ready_; i < pending_.size(); ++i) {
      if (has_image_[i] || pending_[i].image_size == TarSample::kNoImage) continue;
      TarSample& s = pending_[i];
      assert(s.cls_size != TarSample::kNoCls);  // a key is pending for its image or its label
      const std::string_view key = SplitSampleKey(label_name_[i]).first;
      auto other = other_member_.find(key);
      const std::string_view name = other != other_member_.end() ? other->second : label_name_[i];
      s.image_size = TarSample::kNoImage;
      s.name_offset = names_.size();
      s.name_size = static_cast<uint32_t>(name.size());
      names_ += name;
    }
    ready_ = pending_.size();
  }

  // How many samples, from the first, are final: each has its image and its
  // label, so another member of its key is a duplicate (an error from Add),
  // never a change. After Finish, all of them.
  size_t ready() const { return ready_; }

  // The shard's samples so far. REQUIRES: i < ready() for a final one.
  std::span<const TarSample> samples() const { return pending_; }

 private:
  const std::string& path_;
  const uint32_t shard_number_;
  std::string& names_;
  std::deque<std::string> members_;                      // names the views below point into
  std::unordered_map<std::string_view, size_t> by_key_;  // into pending_
  std::unordered_map<std::string_view, std::string_view> other_member_;  // key -> a.webp
  std::map<std::string_view, std::string_view> stray_member_;            // key -> img.004.jpg
  std::vector<TarSample> pending_;
  std::vector<bool> has_image_;
  std::vector<std::string_view> label_name_;
  size_t ready_ = 0;
};

// Feeds the members of `shard`, scanned from its start, to `grouper` until
// the end of the archive (end: true) or until `grouper` has a sample ready
// past `want` (when `want` is given). Errors name the shard.
Status Scan(TarScanner& scanner, SampleGrouper& grouper, std::optional<size_t> want, bool* end) {
  *end = false;
  while (!want || grouper.ready() <= *want) {
    STOKER_ASSIGN_OR_RETURN(std::optional<TarEntry> entry, scanner.Next());
    if (!entry) {
      grouper.Finish();
      *end = true;
      return Status::Ok();
    }
    STOKER_RETURN_IF_ERROR(grouper.Add(std::move(*entry)));
  }
  return Status::Ok();
}

// A label and an image at most this far apart are fetched in one read.
constexpr uint64_t kMaxGapInOneRead = 16 << 10;

// Whether `header`, the block before a member's data, is still a tar header
// of a member of `size` bytes: a tar written over the shard in place (the
// same file, other bytes) moved its members, and the bytes where one lay at
// open are another's, or none.
bool StillItsHeader(const std::byte* header, uint32_t size) {
  if (!ChecksumMatches(header)) return false;
  const std::optional<uint64_t> field = ParseNumber(header, kSizeOff, kSizeLen);
  return field && *field == size;
}

// Reads sample `s` of `shard`, whose key names member `name`: its image
// bytes (in `buffer`) and label into `*record`. Errors name the key.
Status ReadSample(const ShardFile& shard, const TarSample& s, std::string_view name,
                  ReadBuffer& buffer, Record* record) {
  auto key = [&] { return shard.path() + ":" + std::string(name); };
  // Named after an image or a label that it lacks: that member is a link or
  // a sparse file (SampleGrouper::Add).
  const std::string_view ext = SplitSampleKey(name).second;
  if (s.image_size == TarSample::kNoImage &&
      (IsImageExtension(ext) || (ExtensionIs(ext, "cls") && s.cls_size == TarSample::kNoCls))) {
    return DataError(key() +
                     ": the member is a link or a GNU sparse file, not a regular file: stoker "
                     "reads regular members only (write the tar with the file itself: GNU tar "
                     "--hard-dereference, without --sparse)");
  }
  if (s.cls_size == TarSample::kNoCls && s.image_size == TarSample::kNoImage) {
    return DataError(key() + ": its sample key '" + std::string(SplitSampleKey(name).first) +
                     "' has no image (" + std::string(kImageExtensions) + ") and no .cls member" +
                     std::string(kKeyRule));
  }
  if (s.cls_size == TarSample::kNoCls) {
    return DataError(key() + ": sample has no .cls member (its label)");
  }
  if (s.image_size == TarSample::kNoImage) {
    return DataError(key() + ": sample has a label but no image stoker decodes (" +
                     std::string(kImageExtensions) + ")");
  }
  // Each member is read with its header (the block before it), to check it
  // is still there.
  const uint64_t first = std::min(s.image_offset, s.cls_offset) - kBlock;
  const uint64_t last = std::max(s.image_offset + s.image_size, s.cls_offset + s.cls_size);
  const uint64_t apart = uint64_t{s.image_size} + s.cls_size;
  if (!buffer.cap.Allows(apart)) {
    return buffer.cap.Refuse(key() + ": a sample of this size", apart, "reading it");
  }
  std::byte* image;
  std::byte* label;
  const std::byte* image_header;
  const std::byte* label_header;
  std::byte headers[2][kBlock];  // where the members are read apart
  Status status;
  if (last - first <= apart + 2 * kBlock + kMaxGapInOneRead && buffer.cap.Allows(last - first)) {
    // WebDataset writes a sample's members together: the label and the
    // image lie a block or two apart, and one read (a system call costs
    // more than copying those blocks) fetches both, with their headers.
    if (buffer.bytes.size() < last - first) buffer.bytes.resize(last - first);
    image = buffer.bytes.data() + (s.image_offset - first);
    label = buffer.bytes.data() + (s.cls_offset - first);
    image_header = image - kBlock;
    label_header = label - kBlock;
    status = shard.ReadAt(first, {buffer.bytes.data(), static_cast<size_t>(last - first)});
  } else {
    if (buffer.bytes.size() < apart) buffer.bytes.resize(apart);
    image = buffer.bytes.data();
    label = image + s.image_size;
    image_header = headers[0];
    label_header = headers[1];
    status = shard.ReadAt(s.image_offset - kBlock, headers[0]);
    if (status.ok()) status = shard.ReadAt(s.image_offset, {image, s.image_size});
    if (status.ok()) status = shard.ReadAt(s.cls_offset - kBlock, headers[1]);
    if (status.ok()) status = shard.ReadAt(s.cls_offset, {label, s.cls_size});
  }
  if (status.ok() &&
      !(StillItsHeader(image_header, s.image_size) && StillItsHeader(label_header, s.cls_size))) {
    return DataError(key() + ": the tar shard changed since it was opened: its members are no " +
                     "longer where they were (a tar written over it in place?); make the " +
                     "loader again to read it anew");
  }
  if (!status.ok()) return status.WithContext(key());
  std::string_view cls =
      SkipByteOrderMark(std::string_view(reinterpret_cast<const char*>(label), s.cls_size));
  while (!cls.empty() && std::isspace(static_cast<unsigned char>(cls.front()))) {
    cls.remove_prefix(1);
  }
  while (!cls.empty() && std::isspace(static_cast<unsigned char>(cls.back()))) {
    cls.remove_suffix(1);
  }
  Result<int64_t> parsed = ParseLabel(cls);
  if (!parsed.ok()) {
    return parsed.status().WithContext(key() + ": member '" +
                                       std::string(SplitSampleKey(name).first) + ".cls'");
  }
  record->bytes = std::span<const std::byte>(image, s.image_size);
  record->label = *parsed;
  return Status::Ok();
}

class TarShardSource final : public Source {
 public:
  TarShardSource(std::vector<std::unique_ptr<ShardFile>> shards, std::vector<TarSample> samples,
                 std::string names)
      : shards_(std::move(shards)), samples_(std::move(samples)), names_(std::move(names)) {}

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }

  Status Read(int64_t index, ReadBuffer& buffer, Record* record) const override {
    assert(index >= 0 && index < size());
    const TarSample& s = samples_[index];
    return ReadSample(*shards_[s.shard], s, Name(s), buffer, record);
  }

  std::string Key(int64_t index) const override {
    assert(index >= 0 && index < size());
    const TarSample& s = samples_[index];
    return shards_[s.shard]->path() + ":" + std::string(Name(s));
  }

 private:
  std::string_view Name(const TarSample& s) const {
    return std::string_view(names_).substr(s.name_offset, s.name_size);
  }

  std::vector<std::unique_ptr<ShardFile>> shards_;
  std::vector<TarSample> samples_;
  std::string names_;
};

// One shard read as a stream: its headers are scanned only as far as the
// next sample needs, and each sample's members are read when it is handed
// out, so memory grows with the shard's member count, never its data.
class TarShardStream final : public TarShardReader {
 public:
  explicit TarShardStream(std::unique_ptr<ShardFile> file)
      : file_(std::move(file)),
        archive_(file_->Scan()),
        scanner_(archive_, file_->path()),
        grouper_(file_->path(), 0, names_) {}

  Result<bool> Next(TarStreamSample* sample) override {
    STOKER_RETURN_IF_ERROR(failed_);
    if (next_ == grouper_.ready()) {
      if (ended_) return false;
      // An error of the archive or of its grouping ends the stream.
      failed_ = Scan(scanner_, grouper_, next_, &ended_);
      STOKER_RETURN_IF_ERROR(failed_);
      if (next_ == grouper_.ready()) return false;
    }
    const TarSample& s = grouper_.samples()[next_++];
    const std::string_view name = std::string_view(names_).substr(s.name_offset, s.name_size);
    STOKER_RETURN_IF_ERROR(ReadSample(*file_, s, name, buffer_, &record_));
    sample->key.assign(file_->path()).append(":").append(name);
    sample->image = record_.bytes;
    sample->label = record_.label;
    return true;
  }
  bool broken() const override { return !failed_.ok(); }

 private:
  std::unique_ptr<ShardFile> file_;
  FileReader archive_;
  TarScanner scanner_;
  std::string names_;  // the name arena
  SampleGrouper grouper_;
  size_t next_ = 0;  // the next sample to hand out
  bool ended_ = false;
  Status failed_;
  ReadBuffer buffer_;
  Record record_;
};

}  // namespace

namespace {

// What two names of one shard share: the file's device and inode (a relative
// and an absolute path, a symlinked folder, a hard link), else, for a file
// not there yet, the absolute path's normal form.
std::string ShardIdentity(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    return "file " + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  }
  std::error_code error;
  std::filesystem::path absolute = std::filesystem::absolute(path, error);
  return (error ? std::filesystem::path(path) : absolute).lexically_normal().string();
}

}  // namespace

Result<std::vector<std::string>> ExpandShards(const std::vector<std::string>& paths_or_patterns) {
  std::vector<std::string> paths;
  std::unordered_map<std::string, size_t> seen;  // ShardIdentity -> position in `paths`
  for (const std::string& pattern : paths_or_patterns) {
    STOKER_ASSIGN_OR_RETURN(std::vector<std::string> expanded, ExpandBraces(pattern));
    for (std::string& path : expanded) {
      auto [it, fresh] = seen.try_emplace(ShardIdentity(path), paths.size());
      if (!fresh) {
        const std::string& first = paths[it->second];
        return InvalidArgument("tar shard " + path + " is named twice" +
                               (first == path ? "" : " (also as " + first + ")") + " in " +
                               pattern + ": its samples would be read twice");
      }
      paths.push_back(std::move(path));
    }
  }
  if (paths.empty()) return InvalidArgument("no tar shards given");
  return paths;
}

Result<std::shared_ptr<const Source>> OpenTarShards(
    const std::vector<std::string>& paths_or_patterns) {
  STOKER_ASSIGN_OR_RETURN(std::vector<std::string> paths, ExpandShards(paths_or_patterns));
  if (paths.size() >= std::numeric_limits<uint32_t>::max()) {
    return InvalidArgument("too many tar shards: " + std::to_string(paths.size()));
  }
  std::vector<std::unique_ptr<ShardFile>> shards;
  std::vector<TarSample> samples;
  std::string names;
  for (const std::string& path : paths) {
    STOKER_ASSIGN_OR_RETURN(std::unique_ptr<ShardFile> shard, ShardFile::Open(path));
    {
      FileReader archive = shard->Scan();
      TarScanner scanner(archive, shard->path());
      SampleGrouper grouper(shard->path(), static_cast<uint32_t>(shards.size()), names);
      bool end;
      STOKER_RETURN_IF_ERROR(Scan(scanner, grouper, std::nullopt, &end));
      samples.insert(samples.end(), grouper.samples().begin(), grouper.samples().end());
    }
    shard->KeepOpenWithinBudget();
    shards.push_back(std::move(shard));
  }
  if (std::none_of(samples.begin(), samples.end(),
                   [](const TarSample& s) { return s.image_size != TarSample::kNoImage; })) {
    // A member named like an image of another field says why it is none.
    const auto name_of = [&](const TarSample& s) {
      return std::string_view(names.data() + s.name_offset, s.name_size);
    };
    const auto stray = std::find_if(samples.begin(), samples.end(), [&](const TarSample& s) {
      const std::string_view ext = SplitSampleKey(name_of(s)).second;
      const std::string_view kind = MemberKind(ext);
      return kind.size() < ext.size() && (IsImageExtension(kind) || ExtensionIs(kind, "cls"));
    });
    std::string why;
    if (stray != samples.end()) {
      const std::string_view name = name_of(*stray);
      why = ": '" + std::string(name) + "' is a member of sample key '" +
            std::string(SplitSampleKey(name).first) + "'" + std::string(kKeyRule);
    }
    return NotFound("no image members (" + std::string(kImageExtensions) + ") in the tar shards " +
                    paths.front() + (paths.size() > 1 ? " ... " + paths.back() : std::string()) +
                    why);
  }
  samples.shrink_to_fit();
  names.shrink_to_fit();
  return std::shared_ptr<const Source>(
      std::make_shared<TarShardSource>(std::move(shards), std::move(samples), std::move(names)));
}

Result<std::unique_ptr<TarShardReader>> TarShardReader::Open(const std::string& path) {
  STOKER_ASSIGN_OR_RETURN(std::unique_ptr<ShardFile> file, ShardFile::Open(path));
  return std::unique_ptr<TarShardReader>(std::make_unique<TarShardStream>(std::move(file)));
}

}  // namespace stoker
