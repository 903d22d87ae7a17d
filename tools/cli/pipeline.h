#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <ostream>
#include <string>

#include "stoker/loader.h"
#include "stoker/sweep.h"
#include "stoker/synthetic.h"
#include "stoker/tuning.h"

namespace stoker::cli {

/// The flags that say what to load and how: shared by run, bench and demo.
struct PipelineFlags {
  std::string data;  // folder, list file or tar shard(s); empty = built-in data set
  int64_t batch_size = 64;
  int size = 224;
  bool eval = false;
  bool dct_scaling = false;  // JPEG decode at 1/2..1/8 scale: faster, not torchvision's pixels
  std::string layout = "float32-chw";
  uint64_t seed = 0;
  bool no_shuffle = false;
  std::string on_error = "raise";
  std::string workers = "auto";
  int prefetch = 0;              // 0: DefaultPrefetch(workers)
  double read_latency_ms = 0;    // slow-storage wrapper ...
  int read_slots = 0;            // ... serving at most this many reads at once (0: any)
  double memory_budget_mib = 0;  // 0: not given, the default share
  bool synthetic = false;        // a synthetic source instead of images
  double synthetic_cpu_us = 500;
  int64_t synthetic_size = 20000;
};

/// A count >= 0 filling all of `text` but white space on either side, read
/// as std::stoi reads it (a '+' is accepted); nullopt for anything else. The
/// one reading of --workers and of each item of --sweep's list.
std::optional<int> ParseCount(const std::string& text);

/// Registers the flags on `cmd`.
void AddPipelineFlags(CLI::App* cmd, PipelineFlags& flags);

/// What the flags resolve to.
struct Pipeline {
  LoaderOptions loader;              // its `tuner` too
  std::string description;           // for people: "images in /x (2000), train 224, ..."
  std::shared_ptr<SlowSource> slow;  // set when --read-latency-ms was given
};

/// Opens the source and transform the flags describe; makes the built-in data
/// set first when no --data is given and it is missing. Errors name the flag
/// or the file.
Result<Pipeline> BuildPipeline(const PipelineFlags& flags, bool quiet);

/// `stop` for a loop over `p`'s loaders (a run's or a sweep's) that, once it
/// says true, also ends the reads --read-latency-ms keeps waiting
/// (SlowSource::Cancel, for good): a stopped loop's loader is then destroyed
/// at once, not after its workers' slow reads (seconds each).
std::function<bool()> StopEndingSlowReads(const Pipeline& p, std::function<bool()> stop);

/// `status` (from Loader::Make or a sweep) with the LoaderOptions it names
/// (batch_size, the transform's samples, tuner memory_budget_bytes) named as
/// the flags that set them.
Status NameFlags(const Status& status, const PipelineFlags& flags);

/// The flags of `stoker run` (and of the demo, which runs the same job).
struct RunFlags {
  PipelineFlags pipeline;
  double step_ms = 0;
  double seconds = 0;
  int64_t epochs = 0;  // 0: not given (--epochs takes 1 or more)
  std::string trace;
  bool json = false;
  bool quiet = false;
  bool gpu_util = false;  // GPU columns in the live view (NVML)
};
void AddRunFlags(CLI::App* cmd, RunFlags& flags);

/// What a run saw, for the summary.
struct RunSummary {
  std::string description;
  ConsumeStats stats;
  int workers_final = 0;
  std::vector<SkipRecord> skipped;  // the first kSkipRecordsKept
  int64_t skipped_count = 0;        // all
  std::vector<TunerDecision> trace;
  std::optional<TunerView> view;
  size_t peak_rss_bytes = 0;
  int signal = 0;       // SIGINT or SIGTERM when one ended the run early, else 0
  Status trace_status;  // --trace's file not written (a full disk): the run failed
};

/// Runs the stand-in training loop the flags describe, with the live view on
/// stderr unless quiet. A failing sample under --on-error raise is the error.
/// SIGINT or SIGTERM during the loop ends it early: the summary of what ran,
/// with `signal` set, is returned (see StopSignals).
Result<RunSummary> RunJob(const RunFlags& flags);
nlohmann::json RunSummaryToJson(const RunSummary& summary);
void PrintRunSummary(const RunSummary& summary, std::ostream& out);
/// After the summary is printed: a --trace file not written is reported on
/// stderr (stdout has the summary) and the command fails; else `exit_code`.
int ReportTraceError(const std::string& command, const RunSummary& summary, int exit_code);

}  // namespace stoker::cli
