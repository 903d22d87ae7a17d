#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stoker/source.h"
#include "stoker/status.h"

namespace stoker {

// Sources that read encoded images (JPEG, PNG, ...) from files. Each returns
// an immutable Source shared by all workers (see source.h): Read is safe from
// many threads at once and keeps no per-worker state. Paths are byte strings:
// names that are not UTF-8 work, and keys keep their bytes as they are.

/// Opens a class-per-folder tree, `root/<class>/.../<file>`, with the same
/// samples, order and labels as torchvision's ImageFolder on that tree:
/// classes are the sub-folders of `root` (symlinks followed) sorted by name
/// and numbered from 0; each class folder is walked recursively (symlinks
/// followed), its folders visited in sorted order of their paths and files in
/// sorted order, keeping files whose lower-cased name ends with .jpg, .jpeg,
/// .png, .ppm, .bmp, .pgm, .tif, .tiff or .webp. Names sort as Python sorts
/// them (UTF-8 code points; undecodable bytes as surrogate escapes).
///
/// A symlinked folder that leads back to one of its own ancestors (a loop) is
/// skipped, so opening always terminates. Keys are file paths (root joined
/// with the relative path); labels the class index; ClassNames() the folder
/// names.
///
/// Errors: `root` missing or not a folder (NotFound / IoError), no class
/// folder in it, a class folder with no image in it (NotFound naming the
/// folders, as ImageFolder's "Found no valid file for the classes ..."), a
/// folder that cannot be listed (IoError naming it). Reads: a file removed
/// since opening is NotFound naming its path; an unreadable one an IoError.
/// Blocks while it lists the tree.
Result<std::shared_ptr<const Source>> OpenImageFolder(const std::string& root);

/// Opens a list file of "path<TAB>label" lines: the path is everything before
/// the last tab (relative paths resolve against the list file's folder), the
/// label a decimal integer. Blank lines are skipped; a trailing '\r' is
/// ignored. Files are not checked at open; a missing one fails its Read with
/// NotFound naming the path. Keys are the resolved paths.
/// Errors name the list file and the line number: a line without a tab, an
/// empty path, a label that is not an integer; also a list with no entries
/// and an unreadable list file. Blocks while it reads the list.
Result<std::shared_ptr<const Source>> OpenFileList(const std::string& list_path);

/// A source of the files `paths` (bytes; relative ones resolve against the
/// working directory as it is now) with `labels`, in that order, and
/// `class_names` for ClassNames(): the samples a caller already listed
/// (torchvision's `dataset.samples`, as stoker.DataLoader's native path takes
/// them). Files are not checked here; a missing one fails its Read with
/// NotFound naming the path. Keys are the paths as given.
/// Errors: InvalidArgument for lengths that differ, no paths, an empty path
/// or one holding a NUL byte (naming its position).
Result<std::shared_ptr<const Source>> MakePathSource(const std::vector<std::string>& paths,
                                                     const std::vector<int64_t>& labels,
                                                     std::vector<std::string> class_names);

/// Opens WebDataset-style tar shards. `paths_or_patterns` lists shard files;
/// each entry may hold brace ranges ("shard-{000..015}.tar", see
/// ExpandBraces). A sample is the group of members sharing a key (the member
/// name up to the first '.' of its last path component): an image member
/// (.jpg, .jpeg or .png, case-insensitive) and a .cls member whose text is
/// the integer label. Samples are numbered shard by shard in member order.
///
/// Opening indexes each shard's tar headers (ustar, GNU long names, pax)
/// with pread; Read preads a sample's image and label into the worker's
/// ReadBuffer. Reads see the shards as they were opened: each shard file
/// stays open for the source's life (all tar sources together keep at most
/// half the soft RLIMIT_NOFILE open; shards past that are reopened per read
/// and refused if another file was put at their path). Keys are
/// "<shard path>:<image member name>".
///
/// Errors at open (naming the shard, and the byte offset in it): a pattern
/// ExpandShards refuses (a shard named twice), a missing or unreadable
/// shard, a garbage header (bad checksum), a truncated member, a shard list
/// that expands to nothing, shards with no images at all. Errors at
/// Read (naming the key): a sample without a .cls member, a .cls that is not
/// an integer, a shard cut short since it was opened (DataError, "truncated"),
/// a replaced shard (DataError), an OS read error (IoError). Blocks while it
/// indexes.
Result<std::shared_ptr<const Source>> OpenTarShards(
    const std::vector<std::string>& paths_or_patterns);

/// One sample of a tar shard read as a stream (TarShardReader::Next).
struct TarStreamSample {
  /// "<shard path>:<image member name>", as OpenTarShards keys it.
  std::string key;
  /// The image member's bytes, owned by the reader: valid until its next
  /// Next() or its end.
  std::span<const std::byte> image;
  int64_t label = 0;
};

/// Reads one tar shard's samples in order, without opening any other shard
/// or indexing this one first: the samples OpenTarShards numbers for this
/// shard, with the same keys, bytes and labels, by the same grouping rules.
/// Headers are scanned only as far as the next sample needs, and a sample's
/// members are read (pread) when it is handed out, so memory grows with the
/// shard's member count (names and offsets), never with its data.
///
/// Used by one thread at a time; it may move between threads.
class TarShardReader {
 public:
  /// Opens the shard file at `path` (a path, not a pattern). Errors name the
  /// path: missing (NotFound), unreadable (IoError), not a regular file
  /// (InvalidArgument). Blocks while it opens.
  static Result<std::unique_ptr<TarShardReader>> Open(const std::string& path);

  virtual ~TarShardReader() = default;

  /// Reads the next sample into `*sample`: true, or false at the shard's end
  /// (a shard without samples simply ends). Blocks on I/O.
  ///
  /// A sample that cannot be read (no .cls member, a label that is not an
  /// integer, a label without an image stoker decodes, the file cut short
  /// under it) is an error naming its key, and the next call goes on with
  /// the next sample. An error of the archive itself ends the stream, and
  /// every later call returns it again: a garbage header, a truncated member
  /// or archive (naming the shard, the byte offset and the last member read),
  /// a duplicate sample key (naming the shard and the key). Samples before
  /// such an error were delivered: OpenTarShards refuses the whole shard.
  virtual Result<bool> Next(TarStreamSample* sample) = 0;
  /// Whether an error of the archive ended the stream (Next returns it from
  /// now on), as opposed to one sample's error, after which it goes on.
  virtual bool broken() const = 0;
};

/// The kind of source a data path names (see OpenDataPath).
enum class DataPathKind { kImageFolder, kTarShards, kFileList };

/// Opens the source that one path names, as the CLI's --data and Python's
/// stoker.Loader("<path>") take it, deciding in this order: an existing
/// folder (symlinks followed) is an image folder (OpenImageFolder); else a
/// name ending in ".tar" or holding a '{' (a brace pattern) is tar shards
/// (OpenTarShards of that one entry); else a regular file is a file list
/// (OpenFileList). When `kind` is not null it receives the kind opened.
///
/// Errors: a path that does not exist (and is no shard name) is NotFound
/// naming it; one that exists but is neither a folder nor a regular file (a
/// device, a socket) is InvalidArgument naming it; a path that cannot be
/// examined is an IoError naming it; otherwise the opener's errors. Blocks
/// while the source opens.
Result<std::shared_ptr<const Source>> OpenDataPath(const std::string& path,
                                                   DataPathKind* kind = nullptr);

/// What a data path names when nothing of it exists, else empty: the path;
/// for a brace pattern (its shards need not all be there), the pattern when
/// none of its names exists (a pattern ExpandBraces refuses is left to the
/// opener to name). What the CLI's --data and Python's probe() refuse.
std::string MissingDataPlace(const std::string& data_path);

/// The most names one brace pattern may expand to: far past any real shard
/// list (each shard is a mapping, and Linux allows 65530 per process by
/// default), small enough that the names fit in memory.
inline constexpr uint64_t kMaxBraceNames = 1'000'000;
/// The most bytes of names one brace pattern may expand to (as many names
/// times the longest name).
inline constexpr uint64_t kMaxBraceBytes = uint64_t{256} << 20;

/// Expands the brace ranges in `pattern`: "{a..b}" becomes the integers a to
/// b in order (either direction; 64-bit signed bounds), each zero-padded to
/// the width of the wider bound when a bound has a leading zero ("{08..10}"
/// -> 08 09 10), and "{x,y,z}" the listed alternatives. Several groups
/// multiply, leftmost slowest. Expanded text is not expanded again, and a
/// group holding a '{' is literal, so groups do not nest. Text without
/// braces, or with braces that are not a valid group (a bound that is not
/// an integer or does not fit in 64 bits), is returned as it is.
///
/// The count is worked out before any name is made: a pattern expanding to
/// more than kMaxBraceNames names, or kMaxBraceBytes bytes of names, is an
/// InvalidArgument naming the pattern and the count.
Result<std::vector<std::string>> ExpandBraces(const std::string& pattern);

/// The shard files `paths_or_patterns` name, each entry's braces expanded,
/// in order: what OpenTarShards and a TarStream read. InvalidArgument for
/// none, or for a shard named twice ("a/./s.tar" is "a/s.tar"), naming it:
/// its samples would be read twice.
Result<std::vector<std::string>> ExpandShards(const std::vector<std::string>& paths_or_patterns);

}  // namespace stoker
