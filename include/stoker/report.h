#pragma once

#include <cstdio>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/gpu_sampler.h"
#include "stoker/loader.h"
#include "stoker/status.h"
#include "stoker/sweep.h"
#include "stoker/tuner.h"

namespace stoker {

/// The sweep's table for people: one row per worker count, the best marked,
/// then the tuner's line (when tuned_measured), and a line saying so when the
/// sweep was interrupted.
std::string FormatSweepTable(const SweepReport& report);

/// {"sweep": [{workers, samples_per_s, stall_fraction}], "best_static":
/// {workers, samples_per_s} (null without points), "tuned": {samples_per_s,
/// workers_final, workers_max, stall_fraction, seconds_to_95pct, timeline}
/// and "ratio" (both null unless tuned_measured), "decisions": [...],
/// "interrupted".
nlohmann::json SweepToJson(const SweepReport& report);

/// [{t_s, samples_per_s, produced_per_s, workers, stall_fraction}]: a run's timeline (the
/// tuned run's in SweepToJson, `stoker run --json`'s "timeline").
nlohmann::json TimelineToJson(const std::vector<TimelinePoint>& timeline);

// The engine's public structs as JSON, the one form the CLI's --json output
// and Python's dicts (stats(), skipped()) share. Keys are the field names.
// A checkpoint's JSON is the engine's, beside LoaderState (stoker/loader.h).

/// Every counter of `metrics`, with "workers": [{id, samples, busy_ns,
/// cpu_ns, queue_ns}] for the threads running and "recent": {batches_delivered,
/// samples_delivered, user_samples_delivered, consumer_wait_ns,
/// consumer_step_ns} over the consumer's last few seconds.
nlohmann::json LoaderMetricsToJson(const LoaderMetrics& metrics);

/// {"epoch", "index", "key", "reason"}. The key is a path's bytes as they
/// are (not necessarily UTF-8).
nlohmann::json SkipRecordToJson(const SkipRecord& record);
/// The skipped samples as lines of a human view, each `indent`ed: the first
/// ten named with their epochs and reasons, then how many more of `count` in all.
std::string FormatSkipped(const std::vector<SkipRecord>& skipped, int64_t count,
                          std::string_view indent);

/// {registry (the file, or null without one), note, share_cores,
/// budget_cores, loaders, workers, cpu_cores}: NodeView's fields.
nlohmann::json NodeViewToJson(const NodeView& view);

/// {"registries": [...], "notes": [...], "loaders": [{pid, loader_id,
/// local_rank (null: none), tuned, workers, prefetch_batches, samples_per_s,
/// stall_fraction, cpu_cores, want_cores (null: data-bound), share_cores,
/// budget_cores (both null for a fixed count), heartbeat_age_s, command}]}.
nlohmann::json NodeLoadersToJson(const NodeLoaders& node);

/// `stoker monitor`'s table: a row per loader (pid, rank, workers, prefetch,
/// samples/s, stall, CPU, share, command cut to fit `columns`; 0: whole), its totals,
/// and a line naming the registry, or saying there is no loader.
std::string FormatNodeLoaders(const NodeLoaders& node, size_t columns);

/// {workers, prefetch_batches, cpu_budget_workers, max_workers,
/// memory_budget_bytes, samples_per_s, stall_fraction, phase, decisions,
/// last_decision, node}: the last decision as TunerDecisionToJson writes it,
/// or null before the first; node as NodeViewToJson writes it.
nlohmann::json TunerViewToJson(const TunerView& view);

/// An SVG picture with two panels: throughput against worker count (the
/// sweep), and the tuned run's workers and throughput over time, the best
/// static throughput drawn as a reference line.
std::string SweepToSvg(const SweepReport& report, const std::string& title);

/// A one-line live status for a terminal: progress, samples/s, stall,
/// workers, CPU, memory, the tuner's last decision. Writes to `out`; on a
/// terminal it redraws one line, elsewhere it prints a line every few seconds.
/// Not thread-safe: one consumer thread.
class LiveView {
 public:
  explicit LiveView(std::FILE* out);
  /// Draws `point`; `progress` is e.g. "epoch 1 37 %" and `decision` the
  /// tuner's latest reason (may be empty); `node` (may be empty) this
  /// loader's share of the node and the node's totals (NodeViewText), `gpu`
  /// (may be empty) the GPU columns (GpuColumns).
  void Update(const TimelinePoint& point, const std::string& progress, const std::string& decision,
              const std::string& node = "", const std::string& gpu = "");
  /// Ends the live line so that what follows starts on a fresh one.
  void Finish();

 private:
  std::FILE* out_;
  bool tty_;
  double last_print_s_ = -1e9;
  double cpu_last_s_ = 0;
  double wall_last_s_ = 0;
};

/// `text` as a terminal may show it: control bytes other than newline and
/// tab (ESC, CR, BEL in a file or tar member name) as \xNN, so a name cannot
/// move the cursor, recolour or retitle the terminal. For human output (the CLI's, the report's
/// tables).
std::string Printable(std::string_view text);
/// Printable, newline and tab as \x0a and \x09 too: a name that is one line
/// of a list (a file or tar member name, a command line).
std::string PrintableLine(std::string_view text);

/// The columns of the terminal `out` is now (it may be resized), else
/// $COLUMNS, else 80.
size_t TerminalColumns(std::FILE* out);

/// The live view's words for a loader's place on its node, e.g. "share
/// 1.5/4.0 cores, node: 3 loaders, 7 workers"; "no node registry" without
/// one.
std::string NodeViewText(const NodeView& node);

/// GPU columns for the live view: "GPU0 37% 1.0/8.0GiB PCIe rx 120 tx 3 MB/s"
/// per GPU (a figure NVML did not give is left out).
std::string GpuColumns(const std::vector<GpuUsage>& gpus);

}  // namespace stoker
