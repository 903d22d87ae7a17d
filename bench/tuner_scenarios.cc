// The tuner's scenarios, side by side with static sweeps in one run, with the
// goals checked: tuned >= 97 % of the best static setting, 95 % of it within
// 5 s, consumer-bound stall < 1 % with at most the fewest zero-stall workers
// + 1, back within 95 % <= 5 s after a phase change, the memory budget never
// exceeded.
//
// Usage: tuner_scenarios DATA_FOLDER [scenario ...]
//   scenarios: cpu io consumer phase-step phase-hog phase-latency memory
//   (DATA_FOLDER: e.g. the built-in data set, `stoker make-dataset OUT`.)

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "stoker/image.h"
#include "stoker/image_sources.h"
#include "stoker/sweep.h"
#include "stoker/synthetic.h"
#include "stoker/tuner.h"

extern char** environ;

namespace stoker {
namespace {

int failures = 0;

void Goal(bool ok, const char* what, double value, const char* unit) {
  std::printf("    %-52s %10.2f %-4s %s\n", what, value, unit, ok ? "PASS" : "FAIL");
  failures += ok ? 0 : 1;
}

// Seconds after `from` until a 1 s window first reaches `target` samples/s.
double TimeTo(const std::vector<TimelinePoint>& tl, double from, double target) {
  for (const auto& p : tl) {
    if (p.t_s < from + 1.0) continue;
    if (MeanRate(tl, p.t_s - 1.0, p.t_s) >= target) return p.t_s - from;
  }
  return 1e9;
}

void PrintSweep(const SweepReport& r) {
  std::printf("    static:");
  for (const auto& p : r.sweep) std::printf(" %d:%.0f", p.workers, p.samples_per_s);
  std::printf("  (best %d workers, %.1f samples/s)\n", r.best_static.workers,
              r.best_static.samples_per_s);
}

// CPU hogs: one busy shell loop per core, killed when this goes away.
class CpuHog {
 public:
  explicit CpuHog(int n) {
    for (int i = 0; i < n; ++i) {
      pid_t pid;
      const char* argv[] = {"/bin/sh", "-c", "while :; do :; done", nullptr};
      if (posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ) == 0) {
        pids_.push_back(pid);
      }
    }
  }
  ~CpuHog() {
    for (pid_t p : pids_) {
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
  }

 private:
  std::vector<pid_t> pids_;
};

void PrintTrace(const std::vector<TunerDecision>& trace) {
  for (const auto& d : trace) {
    std::printf("      %5.1fs %3d -> %-3d %s\n", d.t_s, d.workers_before, d.workers_after,
                d.reason.c_str());
  }
}

struct Setup {
  LoaderOptions base;
  std::shared_ptr<SlowSource> slow;
};

Setup MakeSetup(const std::string& data, ImageLayout layout = ImageLayout::kFloat32CHW) {
  Setup s;
  auto src = OpenImageFolder(data);
  if (!src.ok()) {
    std::fprintf(stderr, "tuner_scenarios: %s\n", src.status().ToString().c_str());
    std::exit(2);
  }
  s.slow = std::make_shared<SlowSource>(*src, std::chrono::nanoseconds(0));
  ImageTransformOptions io;
  io.layout = layout;
  s.base.source = s.slow;
  s.base.transform = *MakeImageTransform(io);
  s.base.batch_size = 64;
  return s;
}

SweepReport Sweep(const LoaderOptions& base, SweepOptions o) {
  auto r = RunSweep(base, o);
  if (!r.ok()) {
    std::fprintf(stderr, "tuner_scenarios: %s\n", r.status().ToString().c_str());
    std::exit(2);
  }
  return *r;
}

// Returns the best static setting (for the phase scenarios).
SweepPoint SteadyScenario(const char* name, Setup& s, double latency_ms) {
  std::printf("\n== %s%s\n", name, latency_ms > 0 ? " (slow storage)" : "");
  s.slow->set_latency(std::chrono::nanoseconds(static_cast<int64_t>(latency_ms * 1e6)));
  SweepOptions o;
  o.tuned_seconds = 15;
  SweepReport r = Sweep(s.base, o);
  PrintSweep(r);
  std::printf("    tuned: %.1f samples/s, settled on %d workers (max %d)\n", r.tuned_samples_per_s,
              r.tuned_workers_final, r.tuned_workers_max);
  PrintTrace(r.trace);
  Goal(r.ratio >= 0.97, "tuned / best static (>= 0.97)", r.ratio, "");
  Goal(r.seconds_to_95pct >= 0 && r.seconds_to_95pct <= 5, "seconds to 95 % of best (<= 5)",
       r.seconds_to_95pct, "s");
  s.slow->set_latency(std::chrono::nanoseconds(0));
  return r.best_static;
}

void ConsumerScenario(Setup& s) {
  std::printf("\n== consumer-bound: 200 ms step per batch of 64\n");
  SweepOptions o;
  o.workers = {1, 2, 3, 4};
  o.step_ms = 200;
  o.point_seconds = 4;
  o.warmup_seconds = 2;
  o.run_tuned = false;
  SweepReport r = Sweep(s.base, o);
  std::printf("    static (workers:stall%%):");
  int fewest = -1;
  for (const auto& p : r.sweep) {
    std::printf(" %d:%.2f", p.workers, p.stall_fraction * 100);
    if (fewest < 0 && p.stall_fraction < 0.01) fewest = p.workers;
  }
  std::printf("  fewest zero-stall: %d\n", fewest);
  LoaderOptions lo = s.base;
  lo.workers = kAutoWorkers;
  auto loader = std::move(OpenLoader(lo)).value();
  ConsumeOptions co;
  co.seconds = 25;
  co.step_ms = 200;
  auto st = std::move(Consume(*loader, co)).value();
  double stall = MeanStall(st.timeline, 5, st.seconds);
  std::printf("    tuned: %d workers at the end, stall after 5 s %.2f %% (whole run %.2f %%)\n",
              loader->workers(), stall * 100, st.stall_fraction * 100);
  Goal(stall < 0.01, "tuned stall after settling (< 1 %)", stall * 100, "%");
  Goal(fewest > 0 && loader->workers() <= fewest + 1, "tuned workers (<= fewest zero-stall + 1)",
       loader->workers(), "");
}

// A tuned run whose workload changes at t = 12 s; `change` applies it.
// `best` is the best static setting for the workload after the change, from
// a sweep before the run; it is measured again right after the run, under
// the same change, and the reference is the mean of the two (A/B/A).
void PhaseScenario(const char* name, Setup& s, SweepPoint best,
                   const std::function<void(double t, bool& done)>& change, double step_before) {
  std::printf("\n== phase change: %s at t = 12 s\n", name);
  LoaderOptions lo = s.base;
  lo.workers = kAutoWorkers;
  auto loader = std::move(OpenLoader(lo)).value();
  ConsumeOptions co;
  co.seconds = 30;
  bool done = false;
  co.on_batch = [&](double t) {
    if (!done && t >= 12) change(t, done);
  };
  co.step_ms_at = [&](double t) { return t < 12 ? step_before : 0.0; };
  auto st = std::move(Consume(*loader, co)).value();
  const auto trace = GetTunerTrace(*loader);
  const int workers_end = loader->workers();
  loader.reset();
  SweepOptions again;
  again.workers = {best.workers};
  again.run_tuned = false;
  again.confirm_top = 0;
  const double after = Sweep(s.base, again).sweep[0].samples_per_s;
  const double best_after = (best.samples_per_s + after) / 2;
  std::printf("    best static afterwards (%d workers): %.1f samples/s before the run, %.1f after "
              "-> %.1f\n",
              best.workers, best.samples_per_s, after, best_after);
  double back = TimeTo(st.timeline, 12, 0.95 * best_after);
  double steady = MeanRate(st.timeline, 17, st.seconds);
  std::printf("    after the change: %d workers, %.1f samples/s from t = 17 s\n", workers_end,
              steady);
  PrintTrace(trace);
  Goal(back <= 5, "seconds back within 95 % of best (<= 5)", back, "s");
  Goal(steady >= 0.97 * best_after, "tuned / best static after the change (>= 0.97)",
       steady / best_after, "");
}

void MemoryScenario(const std::string& data) {
  std::printf("\n== memory-limited: 20 ms reads, budget 40 MiB, uint8 output\n");
  Setup s = MakeSetup(data, ImageLayout::kUInt8HWC);
  s.slow->set_latency(std::chrono::milliseconds(20));
  LoaderOptions lo = s.base;
  lo.workers = kAutoWorkers;
  TunerOptions t;
  t.memory_budget_bytes = 40u << 20;
  auto loader = std::move(OpenLoader(lo, t)).value();
  size_t peak = 0;
  int workers_max = 0;
  ConsumeOptions co;
  co.seconds = 20;
  co.on_batch = [&](double) {
    LoaderMetrics m = loader->Metrics();
    peak = std::max(peak, m.bytes_in_flight + m.worker_bytes);
    workers_max = std::max(workers_max, m.workers_target);
  };
  auto st = std::move(Consume(*loader, co)).value();
  std::printf("    tuned: %d workers (max %d), %.1f samples/s, peak buffers+workers %.1f MiB\n",
              loader->workers(), workers_max, st.samples / st.seconds, peak / 1048576.0);
  Goal(peak <= t.memory_budget_bytes, "peak bytes in flight + workers (MiB, <= 40)",
       peak / 1048576.0, "MiB");
}

}  // namespace
}  // namespace stoker

int main(int argc, char** argv) {
  using namespace stoker;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DATA_FOLDER [cpu io consumer phase-step phase-hog "
                         "phase-latency memory]\n", argv[0]);
    return 2;
  }
  std::set<std::string> want(argv + 2, argv + argc);
  auto on = [&](const char* s) { return want.empty() || want.count(s) > 0; };
  Setup s = MakeSetup(argv[1]);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  // The phase scenarios reuse the steady ones' sweeps, or sweep on their own.
  auto sweep_at = [&](double latency_ms) {
    s.slow->set_latency(std::chrono::nanoseconds(static_cast<int64_t>(latency_ms * 1e6)));
    SweepOptions o;
    o.run_tuned = false;
    SweepPoint best = Sweep(s.base, o).best_static;
    s.slow->set_latency(std::chrono::nanoseconds(0));
    return best;
  };
  SweepPoint best_cpu, best_io;
  if (on("cpu")) {
    best_cpu = SteadyScenario("CPU-bound: JPEG train pipeline, consumer as fast as possible", s, 0);
  } else if (on("phase-step")) {
    best_cpu = sweep_at(0);
  }
  if (on("io")) {
    best_io = SteadyScenario("I/O-latency-bound: 20 ms per read", s, 20);
  } else if (on("phase-latency")) {
    best_io = sweep_at(20);
  }
  if (on("consumer")) ConsumerScenario(s);
  if (on("phase-step")) {
    PhaseScenario("step 200 ms -> 0", s, best_cpu, [](double, bool& done) { done = true; }, 200);
  }
  if (on("phase-latency")) {
    PhaseScenario("read latency 0 -> 20 ms", s, best_io,
                  [&](double, bool& done) {
                    s.slow->set_latency(std::chrono::milliseconds(20));
                    done = true;
                  },
                  0);
    s.slow->set_latency(std::chrono::nanoseconds(0));
  }
  if (on("phase-hog")) {
    SweepPoint best_hog;
    {
      CpuHog hog(2);
      SweepOptions o;
      o.run_tuned = false;
      best_hog = Sweep(s.base, o).best_static;
    }
    std::unique_ptr<CpuHog> hog;
    PhaseScenario("two CPU hogs start", s, best_hog,
                  [&](double, bool& done) {
                    hog = std::make_unique<CpuHog>(2);
                    done = true;
                  },
                  0);
  }
  if (on("memory")) MemoryScenario(argv[1]);
  std::printf("\n%d goal(s) failed\n", failures);
  return failures == 0 ? 0 : 1;
}
