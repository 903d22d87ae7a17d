#include "pipeline.h"

#include <cstdio>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <utility>

#include "core/number_text.h"
#include "option_checks.h"
#include "stoker/dataset.h"
#include "stoker/defaults.h"
#include "stoker/image.h"
#include "stoker/image_sources.h"
#include "stop_signals.h"

namespace stoker::cli {

std::optional<int> ParseCount(const std::string& text) {
  // White space on either side alike: std::stoi skips it before the count only.
  constexpr const char* kSpace = " \t\n\v\f\r";
  const size_t first = text.find_first_not_of(kSpace);
  if (first == std::string::npos) return std::nullopt;
  const std::string count = text.substr(first, text.find_last_not_of(kSpace) + 1 - first);
  try {
    size_t used = 0;
    const int value = std::stoi(count, &used);
    if (used == count.size() && value >= 0) return value;
  } catch (const std::logic_error&) {  // std::invalid_argument, std::out_of_range
  }
  return std::nullopt;
}

Status NameFlags(const Status& status, const PipelineFlags& f) {
  if (status.ok()) return status;
  std::string m = status.message();
  auto replace = [&m](const std::string& from, const std::string& to) {
    for (size_t at = m.find(from); at != std::string::npos; at = m.find(from, at + to.size())) {
      m.replace(at, from.size(), to);
    }
  };
  replace("option 'batch_size' = ", "--batch-size ");
  replace("the transform's samples", "samples at --size " + std::to_string(f.size));
  char mib[32];
  std::snprintf(mib, sizeof mib, "%g", f.memory_budget_mib);
  replace("tuner option 'memory_budget_bytes' = " +
              std::to_string(static_cast<size_t>(f.memory_budget_mib * 1024 * 1024)),
          "--memory-budget-mib " + std::string(mib));
  replace("tuner option 'memory_budget_bytes'", "--memory-budget-mib");
  return Status(status.code(), m);
}

void AddPipelineFlags(CLI::App* cmd, PipelineFlags& f) {
  CLI::Option* data =
      cmd->add_option("--data", f.data,
                      "image folder, file list (path<TAB>label) or tar shards (a .tar or a "
                      "shard-{000..015}.tar pattern); default: the built-in data set")
          ->check(ExistingPlace());
  cmd->add_option("--batch-size", f.batch_size, "samples per batch")
      ->check(CountIn(1, kMaxBatchSize));
  cmd->add_option("--size", f.size, "output height and width")->check(CountIn(1, kMaxImageSide));
  CLI::Option* eval = cmd->add_flag(
      "--eval", f.eval, "Resize(size*8/7)+CenterCrop instead of RandomResizedCrop+flip");
  CLI::Option* dct_scaling =
      cmd->add_flag("--dct-scaling", f.dct_scaling,
                    "decode JPEGs at 1/2, 1/4 or 1/8 scale where that covers the output: faster, "
                    "but not torchvision's pixels (default: exact)");
  CLI::Option* layout = cmd->add_option("--layout", f.layout,
                                        "output: float32-chw (normalised), uint8-hwc, uint8-chw")
                            ->check(CLI::IsMember({"float32-chw", "uint8-hwc", "uint8-chw"}));
  cmd->add_option("--seed", f.seed, "shuffle and augmentation seed")->check(CountIn(0, UINT64_MAX));
  cmd->add_flag("--no-shuffle", f.no_shuffle, "sequential order");
  cmd->add_option("--on-error", f.on_error, "a bad sample: raise (stop) or skip (record it)")
      ->check(CLI::IsMember({"raise", "skip"}));
  cmd->add_option(
         "--workers", f.workers,
         "auto (the tuner decides) or a fixed count, at most " + std::to_string(kMaxWorkers))
      ->check(CLI::Validator(
          [](std::string& text) {
            std::optional<int> count = ParseCount(text);
            if (text == "auto" || (count && *count <= kMaxWorkers)) return std::string();
            return "expected 'auto' or an integer from 0 to " + std::to_string(kMaxWorkers) +
                   ", got '" + text + "'";
          },
          "auto|INT"));
  cmd->add_option("--prefetch", f.prefetch,
                  "prefetch depth in batches, with fixed --workers (default: 2, one more per 4 "
                  "workers, up to 16, at least 2 samples a worker)")
      ->check(CountIn(1, kMaxPrefetch));
  CLI::Option* latency =
      cmd->add_option("--read-latency-ms", f.read_latency_ms,
                      "add this latency to every read (simulates slow or remote storage)")
          ->check(NumberIn(0, kMaxLatencyMs));
  cmd->add_option("--read-slots", f.read_slots,
                  "with --read-latency-ms: the store serves at most this many reads at once "
                  "(like NFS, FUSE or a disk; more wait their turn); 0: any number")
      ->check(CountIn(0, kMaxReadSlots))
      ->needs(latency);
  cmd->add_option("--memory-budget-mib", f.memory_budget_mib,
                  "memory the tuner may use for batches and workers (default " +
                      std::to_string(static_cast<int>(kMemoryBudgetShare * 100 + 0.5)) +
                      " % of available)")
      ->check(NumberIn(1, kMaxMemoryBudgetMib));  // 0 would mean the default: refused
  // The image options and the synthetic ones never go together: the run
  // would ignore the ones it was not made of (refused, as run refuses
  // --trace with a fixed --workers).
  CLI::Option* synthetic = cmd->add_flag("--synthetic", f.synthetic,
                                         "a synthetic source instead of images (no --data, "
                                         "--eval, --dct-scaling or --layout)");
  for (CLI::Option* image_only : {data, eval, dct_scaling, layout}) synthetic->excludes(image_only);
  cmd->add_option("--synthetic-cpu-us", f.synthetic_cpu_us, "synthetic: CPU per sample, us")
      ->check(NumberIn(0, kMaxSyntheticCpuUs))
      ->needs(synthetic);
  cmd->add_option("--synthetic-size", f.synthetic_size, "synthetic: samples per epoch")
      ->check(CountIn(1, kMaxSyntheticSize))
      ->needs(synthetic);
}

Result<Pipeline> BuildPipeline(const PipelineFlags& f, bool quiet) {
  if (f.read_slots > 0 && f.read_latency_ms <= 0) {
    return InvalidArgument("--read-slots " + std::to_string(f.read_slots) +
                           " limits the reads that --read-latency-ms slows; with no latency "
                           "there is no store to limit");
  }
  Pipeline p;
  LoaderOptions& lo = p.loader;
  lo.batch_size = f.batch_size;
  lo.seed = f.seed;
  lo.shuffle = !f.no_shuffle;
  lo.on_error = f.on_error == "skip" ? ErrorPolicy::kSkip : ErrorPolicy::kRaise;
  if (f.workers == "auto") {
    lo.workers = kAutoWorkers;
  } else {
    std::optional<int> workers = ParseCount(f.workers);
    if (!workers) {
      return InvalidArgument("--workers must be 'auto' or a count >= 0, got '" + f.workers + "'");
    }
    lo.workers = *workers;
  }
  lo.prefetch_batches = f.prefetch > 0 ? f.prefetch : DefaultPrefetch(lo.workers, lo.batch_size);
  lo.tuner.memory_budget_bytes = static_cast<size_t>(f.memory_budget_mib * 1024 * 1024);

  std::shared_ptr<const Source> source;
  if (f.synthetic) {
    SyntheticOptions so;
    so.size = f.synthetic_size;
    so.sample_bytes = 3 * static_cast<size_t>(f.size) * static_cast<size_t>(f.size);
    so.cpu_cost = std::chrono::nanoseconds(static_cast<int64_t>(f.synthetic_cpu_us * 1000));
    STOKER_ASSIGN_OR_RETURN(source, MakeSyntheticSource(so));
    STOKER_ASSIGN_OR_RETURN(lo.transform,
                            MakeRawTransform({{f.size, f.size, 3}, DType::kUInt8}, true));
    p.description = "synthetic source (" + std::to_string(f.synthetic_size) + " samples, " +
                    FormatNumber(f.synthetic_cpu_us) + " us CPU each)";
  } else {
    std::string data = f.data;
    if (data.empty()) {
      // A stop signal ends the making as it ends make-dataset's: nothing
      // half-made is left, and the command exits 130 or 143.
      STOKER_ASSIGN_OR_RETURN(data, StoppedBySignals([quiet](std::function<bool()> stop) {
                                return EnsureDefaultDataset(quiet, std::move(stop));
                              }));
    }
    auto opened = OpenDataPath(data);
    if (!opened.ok()) return opened.status().WithContext("--data " + data);
    source = *opened;
    ImageTransformOptions io;
    io.mode = f.eval ? ImageMode::kEval : ImageMode::kTrain;
    io.height = io.width = f.size;
    io.resize_shorter = f.size * 8 / 7;
    io.dct_scaling = f.dct_scaling;
    io.layout = f.layout == "uint8-hwc"   ? ImageLayout::kUInt8HWC
                : f.layout == "uint8-chw" ? ImageLayout::kUInt8CHW
                                          : ImageLayout::kFloat32CHW;
    STOKER_ASSIGN_OR_RETURN(lo.transform, MakeImageTransform(io));
    p.description = "images in " + data + " (" + std::to_string(source->size()) + "), " +
                    (f.eval ? "eval " : "train ") + std::to_string(f.size) + ", " + f.layout +
                    (f.dct_scaling ? ", DCT-scaled decode" : "");
  }
  if (f.read_latency_ms > 0) {
    p.slow = std::make_shared<SlowSource>(
        source, std::chrono::nanoseconds(static_cast<int64_t>(f.read_latency_ms * 1e6)),
        f.read_slots);
    source = p.slow;
    p.description += ", +" + FormatNumber(f.read_latency_ms) + " ms per read";
    if (f.read_slots > 0) {
      p.description += " (at most " + std::to_string(f.read_slots) + " at once)";
    }
  }
  lo.source = source;
  return p;
}

std::function<bool()> StopEndingSlowReads(const Pipeline& p, std::function<bool()> stop) {
  return [slow = p.slow, stop = std::move(stop)] {
    const bool stopping = stop();
    if (stopping && slow != nullptr) slow->Cancel();
    return stopping;
  };
}

}  // namespace stoker::cli
