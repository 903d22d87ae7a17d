#pragma once

#include <string>
#include <vector>

namespace stoker {

/// What the tuner learns of the storage behind an I/O-bound pool: how many
/// reads it serves at once. Fed one point per measured window (the worker
/// count, the samples/s, and the time per sample spent off the CPU waiting
/// for reads), it compares the wait across pool sizes. A store that serves
/// any number of reads at once (a sleep, a parallel file system) shows the
/// same wait whatever the pool; one with k service slots (NFS, FUSE, an
/// object-store gateway, a disk) shows a wait that grows with the pool once
/// it passes k, while throughput stays at k / service time. The least wait
/// seen is the service time of a read that did not queue; a pool whose
/// reads waited `queued` x that or more saturated the store, and its rate
/// x the service time is the reads in service at once (Little's law).
/// Pure and deterministic; not thread-safe: one caller at a time.
class StoreModel {
 public:
  struct Point {
    int workers = 0;
    double rate = 0;    // samples/s the workers produced
    double wait_s = 0;  // per sample: wall time off the CPU, waiting for the read
    double rest_s = 0;  // per sample: the rest of its wall time (CPU, run queue)
    double t_s = 0;     // when it was measured (the end of its window)
    // Only a service time: a pool whose reads were not most of its time
    // (under twice its CPU). Never a saturated point itself.
    bool reference = false;
  };

  /// `queued`: the wait over the service time that means reads queue at
  /// the store; `headroom`: workers provisioned above what keeps its slots
  /// busy. REQUIRES: queued > 1, headroom >= 1.
  StoreModel(double queued, double headroom, double stale);

  /// Adds (or, for a count seen before, replaces) a point. Points of larger
  /// pools that produced less by more than `stale` are dropped: the store
  /// got faster since (counted by outrun()).
  /// REQUIRES: p.workers >= 1, p.rate > 0, p.wait_s > 0.
  void Add(const Point& p);
  /// Forgets the points measured before `t_s`: on a store whose service
  /// drifts, an old point's wait is a false service time (a wait at 1x
  /// read against a pool at 2x shows reads queued where none are, and too
  /// few slots).
  void ForgetBefore(double t_s);
  /// Forgets every point (a new workload).
  void Clear() { points_.clear(); }
  /// How many times a larger pool's point was dropped because a smaller
  /// one produced clearly more: the store gained slots or got faster.
  int outrun() const { return outrun_; }

  /// Some pool's reads queued at the store: its concurrency is known.
  bool Saturated() const;
  /// The least wait per sample seen: a read's service time; 0 when no points.
  double service_s() const;
  /// Samples/s one worker makes where its reads do not queue (the least
  /// wait's point): the rate's slope in the pool below the store's knee.
  double UnqueuedRate() const;
  /// Reads the store serves at once, by the queued points. REQUIRES: Saturated().
  double slots() const;
  /// The fewest workers that keep slots() reads in service, without
  /// headroom: fewer leave slots idle. Only where the least wait's point
  /// had fewer workers than slots(), so its reads could not queue and its
  /// wait is the service time; 0 otherwise (a queued wait read as the
  /// service time gives too many slots). REQUIRES: Saturated().
  int SureKnee() const;
  /// The fewest workers that keep slots() reads in service, each spending
  /// rest_s of every sample elsewhere, with headroom. REQUIRES: Saturated().
  int Knee() const;
  /// For decision reasons: "the store serves ~8.0 reads at once (reads wait
  /// 319.5 ms per sample at 128 workers, 20.1 ms at 2)", `item` naming what
  /// a point's times are per (the tuner's unit). REQUIRES: Saturated().
  std::string Describe(const std::string& item = "sample") const;

 private:
  const Point& Least() const;   // the point with the least wait
  const Point& Queued() const;  // the queued point with the most workers

  double queued_, headroom_, stale_;
  std::vector<Point> points_;  // one per worker count
  int outrun_ = 0;
};

}  // namespace stoker
