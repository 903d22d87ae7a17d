#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "stoker/image_sources.h"
#include "stoker/status.h"

namespace stoker {

/// One file to write into a tar shard: its member name (bytes, '/'-separated)
/// and its contents. The data is only borrowed for the WriteTarShard call.
struct TarMember {
  std::string name;
  std::span<const std::byte> data;
};

/// Writes `members`, in order, as a POSIX ustar archive at `path` (replacing
/// any file there): one 512-byte header per member (mode 0644, uid/gid 0,
/// mtime 0), its data padded to 512 bytes, then two zero blocks.
/// A name longer than 100 bytes is split at a '/' into the ustar prefix
/// (<= 155 bytes) and name (<= 100 bytes) fields; a name that cannot be split
/// so, an empty name, or a member of 8 GiB or more is an InvalidArgument
/// error naming the member. I/O errors name `path`. On error the partial file
/// is removed. Blocks; safe to call from any thread (distinct paths).
Status WriteTarShard(const std::string& path, std::span<const TarMember> members);

/// A regular file found in a tar archive: its full name and where its data
/// lies, as a byte offset and size within the archive.
struct TarEntry {
  std::string name;
  uint64_t offset = 0;
  uint64_t size = 0;
  // A link or a GNU sparse file: its bytes are not the file's, and stoker
  // reads none (a sample whose image it is says so).
  bool unread = false;
};

/// Lists the regular-file members of the tar archive held in `bytes`: ustar
/// (name + prefix), GNU ('L' long names, base-256 sizes) and pax ('x' path and
/// size records). Directories, links and other entry types are skipped. The
/// archive ends at its first zero block (tar writes two; one is enough).
/// `what` names the archive in error messages (a path).
/// Errors (DataError, naming `what` and the byte offset): a header whose
/// checksum does not match (garbage), a malformed size field, a header or
/// member data cut short by the end of `bytes`, and `bytes` ending without a
/// zero block, even right after a member (all "truncated", naming the last
/// member read): a cut archive is never read as a shorter one.
/// Pure function of its input; never reads outside `bytes`. This is the
/// tar reader's fuzzing entry point.
Result<std::vector<TarEntry>> IndexTarBytes(std::span<const std::byte> bytes,
                                            const std::string& what);

/// Splits a WebDataset member name into its sample key and its extension:
/// "dir/n0001.seg.png" -> {"dir/n0001", "seg.png"}: the split is at the first
/// '.' of the last path component. No '.' means an empty extension.
std::pair<std::string_view, std::string_view> SplitSampleKey(std::string_view member_name);

// OpenTarShards and TarShardReader (stoker/image_sources.h) live in tar_shard.cc as well;
// ExpandBraces in brace_pattern.cc.

}  // namespace stoker
