#pragma once

// Helpers shared by the source tests: a scratch folder that removes itself,
// and one-line file writing.

#include <grp.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace stoker::testing {

/// A fresh folder under $TMPDIR (or /tmp), removed with everything in it
/// when the object is destroyed.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/stoker-src-XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  /// The folder's path; empty if it could not be made.
  const std::string& path() const { return path_; }
  /// path() + "/" + relative.
  std::string operator/(const std::string& relative) const { return path_ + "/" + relative; }

 private:
  std::string path_;
};

/// Writes `contents` to `path`, making parent folders. Returns false on failure.
inline bool WriteFile(const std::string& path, const std::string& contents) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  return static_cast<bool>(out);
}

/// Reads the whole file at `path` ("" if unreadable).
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::span<const std::byte> AsBytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

inline std::string AsString(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

/// Runs `body` in a forked child that has dropped root to user and group
/// nobody (65534), and returns its exit code (`body`'s return value); -1 if
/// the child could not be made or could not drop privileges. For tests of
/// permission errors, which root does not get.
inline int RunAsNobody(const std::function<int()>& body) {
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 && geteuid() == 0) ::_exit(200);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(201);
    ::_exit(body());
  }
  int wstatus = 0;
  if (::waitpid(pid, &wstatus, 0) != pid || !WIFEXITED(wstatus)) return -1;
  int code = WEXITSTATUS(wstatus);
  return code >= 200 ? -1 : code;
}

}  // namespace stoker::testing
