#include "tune/trace_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "core/unique_fd.h"

namespace stoker {

Result<std::unique_ptr<TraceWriter>> TraceWriter::Open(const std::string& path) {
  // Appended to, never followed: in a shared /tmp another user may have put
  // a link there (a symbolic one, or a hard link to a file of someone else).
  const std::string refused =
      "trace file " + path + ": not a regular file of this user with one link; choose another path";
  Result<UniqueFd> opened =
      OpenRegularFile(AT_FDCWD, path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW);
  if (!opened.ok()) {
    if (opened.status().code() == StatusCode::kInvalidArgument) return InvalidArgument(refused);
    return opened.status().WithContext("trace file " + path);
  }
  struct stat st;
  if (::fstat(opened->get(), &st) != 0 || st.st_uid != ::geteuid() || st.st_nlink != 1) {
    return InvalidArgument(refused);
  }
  const int fd = opened->release();
  File file(::fdopen(fd, "a"));
  if (file == nullptr) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("open trace file " + path, err);
  }
  std::unique_ptr<TraceWriter> writer(new TraceWriter(std::move(file), path));
  Status started = writer->pool_.Resize(1);
  if (!started.ok()) return started.WithContext("trace file " + path + ": its writer thread");
  return writer;
}

TraceWriter::TraceWriter(File file, std::string path)
    : file_(std::move(file)), path_(std::move(path)), pool_([this](int) { Run(); }) {}

TraceWriter::~TraceWriter() {
  {
    MutexLock lock(mu_);
    closing_ = true;
  }
  wake_.NotifyOne();
  pool_.Stop();
  pool_.Join();
}

void TraceWriter::Append(std::string line) {
  {
    MutexLock lock(mu_);
    queue_.push_back(std::move(line));
    ++appended_lines_;
  }
  wake_.NotifyOne();
}

Status TraceWriter::Flush() {
  MutexLock lock(mu_);
  const int64_t appended = appended_lines_;
  while (written_lines_ < appended) written_.Wait(mu_);
  return error_;
}

Status TraceWriter::Write(const std::vector<std::string>& lines) {
  for (const std::string& line : lines) {
    if (std::fwrite(line.data(), 1, line.size(), file_.get()) != line.size() ||
        std::fputc('\n', file_.get()) == EOF) {
      return ErrnoError("write trace file " + path_, errno);
    }
  }
  if (std::fflush(file_.get()) != 0) return ErrnoError("write trace file " + path_, errno);
  return Status::Ok();
}

void TraceWriter::Run() {
  std::vector<std::string> lines;
  bool closing = false;
  bool failed = false;
  while (!closing) {
    {
      MutexLock lock(mu_);
      while (queue_.empty() && !closing_) wake_.Wait(mu_);
      lines.swap(queue_);
      closing = closing_;  // lines appended before closing are all in `lines` now
    }
    Status written = failed ? Status::Ok() : Write(lines);
    {
      MutexLock lock(mu_);
      if (!written.ok()) {
        error_ = std::move(written);
        failed = true;
      }
      written_lines_ += static_cast<int64_t>(lines.size());
    }
    written_.NotifyAll();
    lines.clear();
  }
}

}  // namespace stoker
