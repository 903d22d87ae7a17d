// slowfs: a read-only FUSE 3 passthrough of a directory whose opens (and,
// with --read-ms, reads) take a service time and share N service slots, like
// a remote store or a FUSE server that handles a limited number of requests
// at once. bench/compare_fuse.py mounts it to run the tuner on a real FUSE
// store (issue 15), the counterpart of `stoker run --read-slots` in process.
//
//   slowfs SRC MOUNTPOINT [--open-ms 8] [--read-ms 0] [--slots N]
//          [--overload F] [--drift F] [--drift-s P] [--jitter P] [-f]
//
// Store shapes (issue 27; StoreShape in source/service_slots.h): --overload
// F makes each request's service time grow by F per request waiting past
// the slots (the rate falls when overloaded), --drift F swings service time
// between 1x and F over --drift-s seconds, --jitter P makes that fraction of
// requests 10-50x slower.
//
// Each slowed request books a slot in source/service_slots.h (first come,
// first served; --slots 0: any number at once), sleeps until its service
// ends, then does the real open or pread on SRC. Lookups, getattr and readdir
// are served at once. SIGINT and SIGTERM unmount and exit (libfuse's
// handlers); `fusermount3 -u MOUNTPOINT` does too.

#define FUSE_USE_VERSION 31

#include <dirent.h>
#include <fcntl.h>
#include <fuse.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "source/service_slots.h"

namespace {

// libfuse 3.12+ serves at most 10 requests at once by default (max_threads),
// which would cap the store below --slots and queue fast getattrs behind slow
// opens. 256: a reader thread has one request in flight, the tuner goes to
// 128 workers.
constexpr int kMaxThreads = 256;
// The source does not change while mounted: names and attributes may stay
// in the kernel's cache. Opens are never cached (each open() is a request).
constexpr double kAttrCacheSeconds = 3600;

struct SlowFs {
  std::string src;  // absolute: the daemon runs from "/"
  int64_t open_ns = 0;
  int64_t read_ns = 0;
  stoker::ServiceSlots slots{0};

  std::string Path(const char* path) const { return src + path; }

  // Waits for a slot and the service time; the caller then does the real work.
  void Serve(int64_t service_ns) {
    if (service_ns <= 0) return;
    std::this_thread::sleep_until(std::chrono::steady_clock::time_point(
        std::chrono::nanoseconds(slots.ReserveNow(service_ns))));
  }
};

SlowFs& Fs() { return *static_cast<SlowFs*>(fuse_get_context()->private_data); }

void* Init(fuse_conn_info*, fuse_config* cfg) {
  cfg->entry_timeout = kAttrCacheSeconds;
  cfg->attr_timeout = kAttrCacheSeconds;
  cfg->negative_timeout = kAttrCacheSeconds;
  return fuse_get_context()->private_data;
}

int GetAttr(const char* path, struct stat* st, fuse_file_info*) {
  return lstat(Fs().Path(path).c_str(), st) == 0 ? 0 : -errno;
}

int ReadDir(const char* path, void* buf, fuse_fill_dir_t fill, off_t, fuse_file_info*,
            fuse_readdir_flags) {
  DIR* dir = opendir(Fs().Path(path).c_str());
  if (dir == nullptr) return -errno;
  while (dirent* e = readdir(dir)) {
    struct stat st {};
    st.st_ino = e->d_ino;
    st.st_mode = static_cast<mode_t>(DTTOIF(e->d_type));
    if (fill(buf, e->d_name, &st, 0, static_cast<fuse_fill_dir_flags>(0)) != 0) break;
  }
  closedir(dir);
  return 0;
}

int Open(const char* path, fuse_file_info* fi) {
  if ((fi->flags & O_ACCMODE) != O_RDONLY) return -EROFS;
  SlowFs& fs = Fs();
  fs.Serve(fs.open_ns);
  const int fd = open(fs.Path(path).c_str(), fi->flags);
  if (fd < 0) return -errno;
  fi->fh = static_cast<uint64_t>(fd);
  // Cached pages survive the next open only when reads are not slowed:
  // with --read-ms every read must reach the server.
  fi->keep_cache = fs.read_ns == 0;
  return 0;
}

int Read(const char*, char* buf, size_t size, off_t offset, fuse_file_info* fi) {
  SlowFs& fs = Fs();
  fs.Serve(fs.read_ns);
  const ssize_t n = pread(static_cast<int>(fi->fh), buf, size, offset);
  return n >= 0 ? static_cast<int>(n) : -errno;
}

int Release(const char*, fuse_file_info* fi) {
  close(static_cast<int>(fi->fh));
  return 0;
}

int StatFs(const char* path, struct statvfs* st) {
  return statvfs(Fs().Path(path).c_str(), st) == 0 ? 0 : -errno;
}

std::string RealPath(const std::string& path) {
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) != nullptr ? resolved : path;
}

int64_t Nanos(double ms) { return static_cast<int64_t>(ms * 1e6); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "slowfs: a read-only FUSE passthrough of SRC at MOUNTPOINT whose opens (and reads) take a "
      "service time, at most --slots requests at once."};
  std::string src, mountpoint;
  double open_ms = 8, read_ms = 0;
  int slots = 0;
  stoker::StoreShape shape;
  bool foreground = false;
  app.add_option("SRC", src, "directory to serve")->required()->check(CLI::ExistingDirectory);
  app.add_option("MOUNTPOINT", mountpoint, "empty directory to mount on")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--open-ms", open_ms, "service time of each open, ms")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 60000.0));
  app.add_option("--read-ms", read_ms, "service time of each read request, ms")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 60000.0));
  app.add_option("--slots", slots, "requests served at once (0: any number)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  app.add_option("--overload", shape.overload,
                 "past the slots, each request's service grows by this fraction per request "
                 "waiting")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--drift", shape.drift,
                 "service time swings between 1x and this factor over --drift-s")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 100.0));
  app.add_option("--drift-s", shape.drift_period_s, "the drift's period, seconds")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--jitter", shape.jitter, "this fraction of requests is 10-50x slower")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("-f", foreground, "stay in the foreground");
  app.footer("Unmount with SIGINT/SIGTERM to the process or `fusermount3 -u MOUNTPOINT`.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  SlowFs fs;
  fs.src = RealPath(src);
  const std::string mount = RealPath(mountpoint);
  if (access(fs.src.c_str(), R_OK | X_OK) != 0) {
    std::cerr << "slowfs: SRC " << src << " is not readable: " << std::strerror(errno) << "\n";
    return 2;
  }
  // Serving SRC from a mount inside it would send the server its own requests.
  if (mount == fs.src || mount.rfind(fs.src + "/", 0) == 0) {
    std::cerr << "slowfs: MOUNTPOINT " << mountpoint << " lies inside SRC " << src << "\n";
    return 2;
  }
  fs.open_ns = Nanos(open_ms);
  fs.read_ns = Nanos(read_ms);
  fs.slots.Resize(slots);
  fs.slots.SetShape(shape);

  fuse_operations ops{};
  ops.init = Init;
  ops.getattr = GetAttr;
  ops.readdir = ReadDir;
  ops.open = Open;
  ops.read = Read;
  ops.release = Release;
  ops.statfs = StatFs;

  std::string options = "ro,default_permissions,fsname=slowfs,subtype=slowfs";
#if FUSE_VERSION >= FUSE_MAKE_VERSION(3, 12)
  // max_idle_threads too: left unset, libfuse 3.14 warns "Ignoring invalid
  // max threads value 4294967295" (libfuse issue 1003).
  options += ",max_threads=" + std::to_string(kMaxThreads) +
             ",max_idle_threads=" + std::to_string(kMaxThreads);
#endif
  std::vector<std::string> args = {argv[0], mount, "-o", options};
  if (foreground) args.push_back("-f");
  std::vector<char*> fuse_argv;
  for (std::string& a : args) fuse_argv.push_back(a.data());
  // Mounts, runs the multi-threaded loop until unmounted or signalled, unmounts.
  return fuse_main(static_cast<int>(fuse_argv.size()), fuse_argv.data(), &ops, &fs);
}
