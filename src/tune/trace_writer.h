#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_annotations.h"
#include "core/worker_pool.h"
#include "stoker/status.h"

namespace stoker {

/// Appends lines to a file from a background thread, so that the thread
/// that produces them (the tuner runs on the consumer's) never waits for
/// the disk.
///
/// Append and Flush are safe from any thread; Append never blocks on I/O;
/// lines from one thread reach the file in the order appended. The
/// destructor writes every queued line and joins the writer thread (so it may
/// wait for the disk). A write error after opening ends the writing (the
/// lines after it are dropped, the trace being incomplete) and is kept for
/// Flush to return: the trace is a record, not the loader's output, so only
/// whoever asked for the file learns of it.
class TraceWriter {
 public:
  /// Opens `path` for appending (creating it) at once. Error (naming the
  /// path and the OS's reason) when it cannot be opened: a directory, a
  /// missing parent directory, no permission.
  static Result<std::unique_ptr<TraceWriter>> Open(const std::string& path);

  /// Drains the queue (every line written and flushed), then joins.
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  /// Queues `line` (without its newline; one is added) for the writer thread.
  void Append(std::string line) EXCLUDES(mu_);

  /// Blocks until every line appended before the call is written and
  /// flushed (or dropped after an error); returns the first write error since
  /// the file was opened, naming the path and the OS's reason (a full disk, a
  /// file size limit), or Ok.
  Status Flush() EXCLUDES(mu_);

 private:
  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  using File = std::unique_ptr<std::FILE, FileCloser>;

  TraceWriter(File file, std::string path);
  // Writes `lines` and flushes; the OS's reason when it could not.
  Status Write(const std::vector<std::string>& lines);
  // The writer thread: waits for lines, writes and flushes them outside the
  // lock, and returns once closing with nothing left.
  void Run() EXCLUDES(mu_);

  const File file_;  // written by the writer thread only
  const std::string path_;
  Mutex mu_;
  CondVar wake_;     // lines queued, or closing
  CondVar written_;  // written_lines_ grew
  // Unbounded: at most one line per tuner tick (5 a second by default), and
  // a bound would have to block the consumer or drop lines.
  std::vector<std::string> queue_ GUARDED_BY(mu_);
  bool closing_ GUARDED_BY(mu_) = false;
  int64_t appended_lines_ GUARDED_BY(mu_) = 0;
  int64_t written_lines_ GUARDED_BY(mu_) = 0;  // or dropped after error_
  Status error_ GUARDED_BY(mu_);               // the first write error
  WorkerPool pool_;                            // one thread, running Run; last, so it goes first
};

}  // namespace stoker
