#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/unique_fd.h"
#include "stoker/image_sources.h"
#include "stoker/source.h"

namespace stoker {

/// A source whose samples are whole files, each with a label: what both the
/// file list and the image folder open into.
///
/// Compact for millions of files: all paths live in one byte arena, each
/// NUL-terminated, found by one 64-bit offset; a label is one int64. Relative
/// paths are opened against a directory descriptor held for the source's
/// life (the base folder as it was when opened), absolute paths as they are.
/// Immutable; every method is safe from many threads at once.
class FileListSource final : public Source {
 public:
  /// Collects the samples before the source is made.
  class Builder {
   public:
    /// Adds a sample; `path` is bytes (no NUL), relative to the base folder
    /// unless it starts with '/'.
    void Add(std::string_view path, int64_t label);
    int64_t size() const { return static_cast<int64_t>(offsets_.size()); }

   private:
    friend class FileListSource;
    std::string arena_;
    std::vector<uint64_t> offsets_;
    std::vector<int64_t> labels_;
  };

  /// Makes the source. `base` is the folder relative paths resolve against
  /// ("" for the working directory); keys are base + "/" + path for relative
  /// paths. Errors: `base` cannot be opened as a folder (named).
  static Result<std::shared_ptr<const Source>> Make(std::string base, Builder samples,
                                                    std::vector<std::string> class_names);

  ~FileListSource() override;
  FileListSource(const FileListSource&) = delete;
  FileListSource& operator=(const FileListSource&) = delete;

  int64_t size() const override { return static_cast<int64_t>(offsets_.size()); }
  Status Read(int64_t index, ReadBuffer& buffer, Record* record) const override;
  std::string Key(int64_t index) const override;
  std::vector<std::string> ClassNames() const override { return class_names_; }

 private:
  FileListSource(UniqueFd dir_fd, std::string key_prefix, Builder samples,
                 std::vector<std::string> class_names);
  const char* PathAt(int64_t index) const { return arena_.data() + offsets_[index]; }

  UniqueFd dir_fd_;         // O_PATH: only a base for openat
  std::string key_prefix_;  // base + "/", or "" for the working directory
  std::string arena_;
  std::vector<uint64_t> offsets_;
  std::vector<int64_t> labels_;
  std::vector<std::string> class_names_;
};

}  // namespace stoker
