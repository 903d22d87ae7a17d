#include "command_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <streambuf>

#include "stoker/json_text.h"
#include "stoker/report.h"
#include "stop_signals.h"

namespace stoker::cli {
namespace {

// std::cout's buffer: hands every byte to stdio's stdout at once, as the
// standard synchronised buffer does (stdio keeps the line or full buffering
// it chose for a terminal or a file), and keeps the errno of the first
// failure, which std::cout's state alone forgets.
class CheckedStdoutBuffer final : public std::streambuf {
 public:
  int error() const { return error_; }

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    if (std::fputc(c, stdout) == EOF) return Failed(traits_type::eof());
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    const size_t written = std::fwrite(s, 1, static_cast<size_t>(n), stdout);
    if (written < static_cast<size_t>(n)) Failed(0);
    return static_cast<std::streamsize>(written);
  }
  int sync() override { return std::fflush(stdout) == 0 ? 0 : Failed(-1); }

 private:
  template <typename T>
  T Failed(T result) {
    if (error_ == 0) error_ = errno != 0 ? errno : EIO;
    return result;
  }

  int error_ = 0;
};

CheckedStdoutBuffer g_stdout_buffer;

int Report(const std::string& command, const std::string& message, bool json, int exit_code,
           const char* status) {
  // stdout first: a reader of both streams sees the JSON whatever it waits on.
  if (json) {
    nlohmann::json error = {{"error", message}, {"command", command}, {"exit_code", exit_code}};
    if (status != nullptr) error["status"] = status;
    PrintJson(error);
  }
  std::cerr << (command == "stoker" ? "stoker" : "stoker " + command) << ": " << Printable(message)
            << "\n";
  return exit_code;
}

}  // namespace

void CheckStdoutWrites() {
  // A closed stdout or stderr is held by /dev/null opened read-only: writes
  // to it fail (EBADF), and no file the command opens takes its number and
  // its output.
  for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int held = ::open("/dev/null", O_RDONLY);  // the lowest free number: fd, or 0
    if (held >= 0 && held != fd) {
      ::dup2(held, fd);
      ::close(held);
    }
  }
  std::signal(SIGPIPE, SIG_IGN);
  std::cout.rdbuf(&g_stdout_buffer);
}

int StdoutWriteError() { return g_stdout_buffer.error(); }

int FinishOutput(const std::string& command, int exit_code) {
  g_stdout_buffer.pubsync();  // even when std::cout is bad already
  int error = g_stdout_buffer.error();
  // A failure of bytes written through stdio directly, whose errno is lost.
  if (error == 0 && std::ferror(stdout)) error = EIO;
  if (error == 0) return exit_code;
  std::cerr << (command == "stoker" ? "stoker" : "stoker " + command)
            << ": cannot write the output to stdout: " << std::strerror(error) << "\n";
  return exit_code != 0 ? exit_code : kExitFailed;
}

void PrintJson(const nlohmann::json& value) {
  std::cout << DumpJson(value, 2) << "\n" << std::flush;
}

int ReportError(const std::string& command, const std::string& message, bool json, int exit_code) {
  return Report(command, message, json, exit_code, nullptr);
}

int ReportError(const std::string& command, const Status& status, bool json) {
  int exit_code = status.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailed;
  if (const int signal = InterruptedBy(status); signal != 0) exit_code = ExitCodeFor(signal);
  return Report(command, status.ToString(), json, exit_code, StatusCodeName(status.code()));
}

}  // namespace stoker::cli
