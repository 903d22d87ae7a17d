#include "tune/node_share.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "stoker/defaults.h"
#include "tune/tuner_params.h"

namespace stoker {
namespace {

// Needs are judged on about this much of the recent past: one tick (0.2 s)
// wanders, and a consumer that slows down hands its share back after it.
constexpr double kNeedWindowS = 1.0;

}  // namespace

std::vector<double> SplitNodeBudget(double budget_cores, const std::vector<double>& wants) {
  const size_t n = wants.size();
  std::vector<double> shares(n, 0);
  if (n == 0) return shares;
  const double budget = std::max(0.0, budget_cores);
  const double least = std::min(kMinShareCores, budget / static_cast<double>(n));
  std::vector<double> need(n);
  for (size_t i = 0; i < n; ++i) need[i] = std::isnan(wants[i]) ? least : std::max(wants[i], least);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return need[a] < need[b]; });
  // Water-filling: a need no larger than an equal part of what is left is
  // met (which leaves the others at least as much each); the first larger
  // one and all after it split the rest equally.
  double left = budget;
  size_t met = 0;
  for (; met < n; ++met) {
    const size_t i = order[met];
    if (need[i] > left / static_cast<double>(n - met)) break;
    shares[i] = need[i];
    left -= need[i];
  }
  if (met < n) {
    const double equal = left / static_cast<double>(n - met);
    for (size_t k = met; k < n; ++k) shares[order[k]] = equal;
  } else {
    for (double& s : shares) s += left / static_cast<double>(n);
  }
  return shares;
}

double CoresWanted(double stall, double cpu_cores, bool data_bound_before) {
  const TunerParams params;
  if (stall > (data_bound_before ? params.stall_low : params.stall_high)) {
    return std::numeric_limits<double>::infinity();
  }
  return std::max(0.0, cpu_cores) * params.headroom;
}

uint64_t CpuDomain() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  // FNV-1a over the mask's bytes.
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(&set);
  for (size_t i = 0; i < sizeof set; ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  return h;
}

NodeShare::NodeShare(std::unique_ptr<NodeRegistry> registry, std::string why_none,
                     std::optional<int> local_rank, std::optional<int> local_world_size,
                     Opener reopen, bool tuned)
    : registry_(std::move(registry)),
      reopen_(std::move(reopen)),
      next_open_(std::chrono::steady_clock::now() +
                 std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                     std::chrono::duration<double>(kReopenS))),
      local_rank_(local_rank),
      local_world_size_(std::max(1, local_world_size.value_or(1))),
      domain_(CpuDomain()),
      tuned_(tuned) {
  if (registry_) {
    view_.registry = registry_->path();
  } else {
    view_.note = std::move(why_none);
  }
}

void NodeShare::Rejoin() {
  if (!reopen_) return;
  const auto now = std::chrono::steady_clock::now();
  if (registry_ && (registry_->Detached() || registry_->Damaged())) {
    // Removed (a clean-up of /dev/shm) or replaced: loaders made since are
    // in the file at the path, and each would count the whole budget.
    // Truncated or overwritten: opened again, it is made anew or refused,
    // as a loader starting now would find it.
    registry_.reset();
    view_.registry.clear();
    next_open_ = now;
  }
  if (registry_ || now < next_open_) return;
  next_open_ = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(kReopenS));
  bool busy = false;
  Result<std::unique_ptr<NodeRegistry>> opened = reopen_(&busy);
  if (!opened.ok()) {
    view_.note = opened.status().message();
    return;
  }
  registry_ = std::move(*opened);
  view_.registry = registry_->path();
  view_.note.clear();
}

double NodeShare::Update(double window_s, double wait_s, double cpu_s, int workers,
                         double node_budget_cores, int64_t samples, int prefetch) {
  Rejoin();
  if (window_s > 0) {
    recent_.push_back({window_s, std::clamp(wait_s, 0.0, window_s), std::max(0.0, cpu_s),
                       std::max<int64_t>(0, samples)});
  }
  Tick sum{0, 0, 0, 0};
  for (const Tick& t : recent_) {
    sum.window_s += t.window_s;
    sum.wait_s += t.wait_s;
    sum.cpu_s += t.cpu_s;
    sum.samples += t.samples;
  }
  // Keep the newest ticks that cover kNeedWindowS.
  while (!recent_.empty() && sum.window_s - recent_.front().window_s >= kNeedWindowS) {
    sum.window_s -= recent_.front().window_s;
    sum.wait_s -= recent_.front().wait_s;
    sum.cpu_s -= recent_.front().cpu_s;
    sum.samples -= recent_.front().samples;
    recent_.pop_front();
  }
  const double stall = sum.window_s > 0 ? sum.wait_s / sum.window_s : 0;
  const double cpu_cores = sum.window_s > 0 ? sum.cpu_s / sum.window_s : 0;
  const double want = CoresWanted(stall, cpu_cores, data_bound_);
  data_bound_ = std::isinf(want);
  view_.budget_cores = node_budget_cores;
  // Without the registry, as before it: an equal part per local rank.
  const double fallback = node_budget_cores / local_world_size_;
  if (!registry_) {
    view_.share_cores = fallback;
    view_.loaders = 0;
    view_.workers = 0;
    view_.cpu_cores = 0;
    return fallback;
  }
  NodeLoaderRecord mine;
  mine.local_rank = local_rank_.value_or(-1);
  mine.workers = workers;
  mine.cpu_cores = cpu_cores;
  mine.stall = stall;
  mine.want_cores = want;
  mine.budget_cores = node_budget_cores;
  mine.domain = domain_;
  mine.samples_per_s = sum.window_s > 0 ? static_cast<double>(sum.samples) / sum.window_s : 0;
  mine.share_cores = view_.share_cores;
  mine.prefetch_batches = prefetch;
  mine.tuned = tuned_ ? 1 : 0;
  Result<std::vector<NodeLoader>> live = registry_->Publish(mine);
  if (!live.ok()) {
    view_.note = live.status().message();
    view_.share_cores = share_fraction_ ? *share_fraction_ * node_budget_cores : fallback;
    return view_.share_cores;
  }
  view_.note.clear();
  std::vector<double> wants;
  size_t self = 0;
  int node_workers = 0;
  double node_cpu = 0;
  // Another's record as no loader writes it (a forged or damaged entry): left out.
  const auto plausible = [](const NodeLoaderRecord& r) {
    return r.workers >= 0 && r.workers <= kMaxWorkers && std::isfinite(r.cpu_cores) &&
           r.cpu_cores >= 0 && !std::isnan(r.want_cores) && r.want_cores >= 0;
  };
  for (const NodeLoader& l : *live) {
    if (!l.self && l.record.domain != domain_) continue;  // other CPUs: not our budget
    if (!l.self && (!plausible(l.record) || l.record.tuned == 0)) continue;  // listed only
    if (l.self) self = wants.size();
    wants.push_back(l.self ? mine.want_cores : l.record.want_cores);
    node_workers += l.self ? workers : l.record.workers;
    node_cpu += l.self ? cpu_cores : l.record.cpu_cores;
  }
  const double share = SplitNodeBudget(node_budget_cores, wants)[self];
  share_fraction_ = node_budget_cores > 0 ? share / node_budget_cores : 1.0;
  view_.share_cores = share;
  view_.loaders = static_cast<int>(wants.size());
  view_.workers = node_workers;
  view_.cpu_cores = node_cpu;
  return share;
}

}  // namespace stoker
