#pragma once

#include <cstdint>

namespace stoker {

/// The numbers behind TunerCore's decisions, in one place so that tests can
/// vary them. docs/tuner.md says why each has its value, with the figures.
struct TunerParams {
  // Evidence: how much a judgement needs.
  double min_window_s = 0.5;    // pool windows until they cover this much time ...
  int64_t min_batches = 3;      // ... and this many batches ...
  double max_window_s = 1.5;    // ... unless this much time has passed
  int64_t start_samples = 16;   // samples the first model jump needs
  double trial_window_s = 1.0;  // time a trial is judged on, unless it clearly pays (PaysClearly)
  double refill_samples = 20;   // after a change, skip this many samples' wall time ...
  double max_refill_s = 1.0;    // ... but at most this long
  // After the first jump where reads are the wait, or a step up from a
  // count that grew the rate in proportion: from this many samples' wall
  // time on, the windows may show that it pays (the rest wait as above).
  double linear_refill_samples = 3;
  // Windows while workers of the count still start (worker processes) are
  // not read, nor the refill skip begun, for at most this long after a
  // change: a pool half started reads low, and steps judged against it pay.
  double max_start_s = 10;

  // The model (Little's law).
  double headroom = 1.2;     // provision this much above the demand
  double io_headroom = 3.0;  // and this much above I/O-bound work's CPU-saturation point
  // ... or this much where each worker is a process (WorkerKind::workers_are_processes).
  double process_io_headroom = 1.2;
  double over_budget = 1;  // CPU-bound work holds at most the CPU budget + this many workers

  // What the consumer's waiting means.
  double stall_high = 0.01;  // it waits too much above this share of the time
  double stall_low = 0.003;  // it is fed with margin below this

  // Steps up and down.
  double gain = 0.03;       // a step up must add this much throughput
  double big_gain = 0.1;    // a step up that paid this much: the next one is twice as big
  double down_busy = 0.85;  // step down only if the rest would be at most this busy

  // Workload changes.
  double change = 0.3;      // relative change that means a new workload
  double big_change = 1.0;  // a change this large is believed on one window

  // Other processes on our CPUs.
  double contended_share = 0.25;  // they take this share of our CPU budget or more ...
  double no_idle_share = 0.1;     // ... and the CPUs are idle at most this share of it
  double contended_held = 0.125;  // once contended, until they take less than this share
  double on_cpu = 1.25;           // wall time within this factor of CPU time: CPU-bound

  // Storage that saturates (StoreModel).
  double store_queued = 1.5;  // reads waiting this many times their service time queue at the store
  double store_headroom = 1.2;  // workers above those that keep the store's slots busy
  // Around a saturated store's knee, the tuner's own steps: this share of
  // the pool (at least one worker), both ways, each judged by throughput.
  double store_step = 0.25;
  // The first jump of a pool whose reads are the wait: at most this many
  // times the pool (at least this many workers); steps that pay double it.
  int first_jump = 16;
  // A store step up whose gain is this share of its relative size or more
  // grew in proportion: the store had room, and no count below it is tried.
  double store_linear = 0.75;
  // The rate at a held store knee moving by this much (two windows running):
  // the store changed (gained slots, got slower), verify around it again.
  double store_moved = 0.3;
  // Held this long at a store's knee, the rate there rising by twice `gain`
  // (beyond its noise): the store may have gained slots, verify above.
  double store_faster_s = 20;
  // A second's rate spreading (relative standard deviation, from the ticks)
  // by more than this: store steps are judged on longer windows, as the
  // spread squared, at most store_evidence x trial_window_s.
  double store_noise = 0.02;
  double store_evidence = 3;
  // A store whose rate drifts by `change` within this long (measured at one
  // count before and after a trial): its model forgets points older than
  // this, whose waits would read as a false service time.
  double store_age_s = 10;
  // Before a store's drift is measured, a step's two readings may differ
  // by this much a second from it (relative), if they are at most
  // store_fresh_s apart; older readings are measured again before a verdict.
  double store_drift_bound = 0.01;
  double store_fresh_s = 4;
  // Once the drift is known, a reading older than this is measured again
  // too: chained steps judged against one lucky reading all read as losses.
  double store_fresh_known_s = 12;

  // The decision trace.
  double repeat_s = 30;  // a decision that changes nothing is recorded at most this often
};

}  // namespace stoker
