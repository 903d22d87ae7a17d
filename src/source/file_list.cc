#include "source/file_list.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cassert>
#include <string>
#include <vector>

#include "source/file_reader.h"
#include "source/label_text.h"

namespace stoker {

void FileListSource::Builder::Add(std::string_view path, int64_t label) {
  assert(path.find('\0') == std::string_view::npos);
  offsets_.push_back(arena_.size());
  arena_.append(path);
  arena_.push_back('\0');
  labels_.push_back(label);
}

Result<std::shared_ptr<const Source>> FileListSource::Make(std::string base, Builder samples,
                                                           std::vector<std::string> class_names) {
  const char* dir = base.empty() ? "." : base.c_str();
  UniqueFd fd(::open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError(std::string(dir) + ": open folder", errno);
  std::string key_prefix = base.empty() ? "" : (base.back() == '/' ? base : base + "/");
  samples.arena_.shrink_to_fit();
  samples.offsets_.shrink_to_fit();
  samples.labels_.shrink_to_fit();
  return std::shared_ptr<const Source>(new FileListSource(
      std::move(fd), std::move(key_prefix), std::move(samples), std::move(class_names)));
}

FileListSource::FileListSource(UniqueFd dir_fd, std::string key_prefix, Builder samples,
                               std::vector<std::string> class_names)
    : dir_fd_(std::move(dir_fd)),
      key_prefix_(std::move(key_prefix)),
      arena_(std::move(samples.arena_)),
      offsets_(std::move(samples.offsets_)),
      labels_(std::move(samples.labels_)),
      class_names_(std::move(class_names)) {}

FileListSource::~FileListSource() = default;

Status FileListSource::Read(int64_t index, ReadBuffer& buffer, Record* record) const {
  assert(index >= 0 && index < size());
  std::span<const std::byte> bytes;
  Status status = ReadWholeFile(dir_fd_.get(), PathAt(index), buffer, &bytes);
  if (!status.ok()) return status.WithContext(Key(index));
  record->bytes = bytes;
  record->label = labels_[index];
  return Status::Ok();
}

std::string FileListSource::Key(int64_t index) const {
  assert(index >= 0 && index < size());
  const char* path = PathAt(index);
  return path[0] == '/' ? std::string(path) : key_prefix_ + path;
}

namespace {

// Reads the whole list file.
Result<std::string> ReadListFile(const std::string& list_path) {
  ReadBuffer buffer;
  std::span<const std::byte> bytes;
  Status status = ReadWholeFile(AT_FDCWD, list_path.c_str(), buffer, &bytes);
  if (!status.ok()) return status.WithContext(list_path);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

Result<std::shared_ptr<const Source>> OpenFileList(const std::string& list_path) {
  STOKER_ASSIGN_OR_RETURN(std::string text, ReadListFile(list_path));
  // A list is text: a NUL byte says the file is something else (a JPEG given for its folder).
  if (text.find('\0') != std::string::npos) {
    return InvalidArgument(list_path +
                           " holds binary data (an image? an archive?), not a list of "
                           "'path<TAB>label' lines");
  }
  FileListSource::Builder samples;
  std::string_view rest = SkipByteOrderMark(text);
  int64_t line_number = 0;
  while (!rest.empty()) {
    ++line_number;
    size_t newline = rest.find('\n');
    std::string_view line = rest.substr(0, newline);
    rest.remove_prefix(newline == std::string_view::npos ? rest.size() : newline + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (Trim(line).empty()) continue;
    auto where = [&] { return list_path + ":" + std::to_string(line_number) + ": "; };
    // Spaces or tabs may follow the label; the last tab before them starts it.
    std::string_view content = line;
    while (!content.empty() && (content.back() == ' ' || content.back() == '\t')) {
      content.remove_suffix(1);
    }
    size_t tab = content.rfind('\t');
    if (tab == std::string_view::npos) tab = line.find('\t');  // a tab, then no label
    if (tab == std::string_view::npos) {
      return InvalidArgument(where() + "expected 'path<TAB>label', found no tab in '" +
                             std::string(line) + "'");
    }
    std::string_view path = line.substr(0, tab);
    std::string_view label_text = Trim(line.substr(tab + 1));
    if (path.empty()) return InvalidArgument(where() + "empty path");
    Result<int64_t> label = ParseLabel(label_text);
    if (!label.ok()) return InvalidArgument(where() + label.status().message());
    samples.Add(path, *label);
  }
  if (samples.size() == 0) return InvalidArgument(list_path + ": the list has no entries");
  size_t slash = list_path.rfind('/');
  // The list's folder; "/" itself for a list at the root.
  std::string base =
      slash == std::string::npos ? std::string() : list_path.substr(0, slash == 0 ? 1 : slash);
  return FileListSource::Make(std::move(base), std::move(samples), {});
}

Result<std::shared_ptr<const Source>> MakePathSource(const std::vector<std::string>& paths,
                                                     const std::vector<int64_t>& labels,
                                                     std::vector<std::string> class_names) {
  if (paths.size() != labels.size()) {
    return InvalidArgument("path source: " + std::to_string(paths.size()) + " paths but " +
                           std::to_string(labels.size()) + " labels");
  }
  if (paths.empty()) return InvalidArgument("path source: no paths");
  FileListSource::Builder samples;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (paths[i].empty() || paths[i].find('\0') != std::string::npos) {
      return InvalidArgument("path source: path " + std::to_string(i) +
                             (paths[i].empty() ? " is empty" : " holds a NUL byte"));
    }
    samples.Add(paths[i], labels[i]);
  }
  return FileListSource::Make("", std::move(samples), std::move(class_names));
}

}  // namespace stoker
