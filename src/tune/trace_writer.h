#pragma once

#include <condition_variable>
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
/// Append is safe from any thread and never blocks on I/O; lines from one
/// thread reach the file in the order appended. The destructor writes every
/// queued line and joins the writer thread (so it may wait for the disk).
/// Write errors after opening are not reported: the trace is a record, not
/// the loader's output.
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

 private:
  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  using File = std::unique_ptr<std::FILE, FileCloser>;

  explicit TraceWriter(File file);
  // The writer thread: waits for lines, writes and flushes them outside the
  // lock, and returns once closing with nothing left.
  void Run() EXCLUDES(mu_);

  const File file_;  // written by the writer thread only
  Mutex mu_;
  CondVar wake_;  // lines queued, or closing
  // Unbounded: at most one line per tuner tick (5 a second by default), and
  // a bound would have to block the consumer or drop lines.
  std::vector<std::string> queue_ GUARDED_BY(mu_);
  bool closing_ GUARDED_BY(mu_) = false;
  WorkerPool pool_;  // one thread, running Run; last, so it goes first
};

}  // namespace stoker
