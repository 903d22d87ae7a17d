#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "stoker/report.h"

namespace stoker {

namespace {

// The samples the runs skipped (--on-error skip): the rates above left them out.
void PrintSkipped(const SweepReport& r, std::ostringstream& out) {
  if (r.skipped.empty()) return;
  out << "\nskipped " << r.skipped.size() << (r.skipped.size() == 1 ? " sample" : " samples")
      << " (their errors skipped, the rates count only the others):\n"
      << FormatSkipped(r.skipped, static_cast<int64_t>(r.skipped.size()), "  ");
}

}  // namespace

std::string FormatSweepTable(const SweepReport& r) {
  std::ostringstream out;
  char line[200];
  std::snprintf(line, sizeof line, "%9s  %14s  %8s\n", "workers", "samples/s", "stall");
  out << line;
  for (const auto& p : r.sweep) {
    std::snprintf(line, sizeof line, "%9d  %14.1f  %7.1f%%%s\n", p.workers, p.samples_per_s,
                  p.stall_fraction * 100, p.workers == r.recommended.workers ? "   <- best" : "");
    out << line;
  }
  if (!r.tuned_measured) {
    if (r.interrupted) {
      out << "\ninterrupted: " << r.sweep.size() << (r.sweep.size() == 1 ? " count" : " counts")
          << " measured, no tuned run\n";
    }
    PrintSkipped(r, out);
    return out.str();
  }
  std::snprintf(line, sizeof line, "%9s  %14.1f  %7.1f%%   settled on %d worker%s (max %d)\n",
                "tuned", r.tuned_samples_per_s, r.tuned_stall_fraction * 100, r.tuned_workers_final,
                r.tuned_workers_final == 1 ? "" : "s", r.tuned_workers_max);
  out << line;
  char reached[48] = "never reached";
  if (r.seconds_to_95pct >= 0) {
    std::snprintf(reached, sizeof reached, "reached after %.1f s", r.seconds_to_95pct);
  }
  std::snprintf(line, sizeof line, "\ntuned / best static: %.1f %%; 95 %% of the best %s\n",
                r.ratio * 100, reached);
  out << line;
  if (r.interrupted) out << "interrupted before the best static setting was measured again\n";
  PrintSkipped(r, out);
  return out.str();
}

nlohmann::json TimelineToJson(const std::vector<TimelinePoint>& timeline) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& p : timeline) {
    out.push_back({{"t_s", p.t_s},
                   {"samples_per_s", p.samples_per_s},
                   {"produced_per_s", p.produced_per_s},
                   {"workers", p.workers},
                   {"stall_fraction", p.stall_fraction}});
  }
  return out;
}

nlohmann::json SweepToJson(const SweepReport& r) {
  nlohmann::json sweep = nlohmann::json::array();
  for (const auto& p : r.sweep) {
    sweep.push_back({{"workers", p.workers},
                     {"samples_per_s", p.samples_per_s},
                     {"stall_fraction", p.stall_fraction}});
  }
  nlohmann::json decisions = nlohmann::json::array();
  for (const auto& d : r.trace) decisions.push_back(TunerDecisionToJson(d));
  nlohmann::json best = nullptr, recommended = nullptr;
  if (!r.sweep.empty()) {
    best = {{"workers", r.best_static.workers}, {"samples_per_s", r.best_static.samples_per_s}};
    recommended = {{"workers", r.recommended.workers},
                   {"samples_per_s", r.recommended.samples_per_s}};
  }
  nlohmann::json skipped = nlohmann::json::array();
  for (const SkipRecord& k : r.skipped) skipped.push_back(SkipRecordToJson(k));
  nlohmann::json tuned = nullptr;
  if (r.tuned_measured) {
    tuned = {{"samples_per_s", r.tuned_samples_per_s},
             {"workers_final", r.tuned_workers_final},
             {"workers_max", r.tuned_workers_max},
             {"stall_fraction", r.tuned_stall_fraction},
             {"seconds_to_95pct", r.seconds_to_95pct < 0 ? nlohmann::json(nullptr)
                                                         : nlohmann::json(r.seconds_to_95pct)},
             {"timeline", TimelineToJson(r.tuned_timeline)}};
  }
  return {{"sweep", sweep},
          {"best_static", best},
          {"recommended", recommended},
          {"tuned", tuned},
          {"ratio", r.tuned_measured ? nlohmann::json(r.ratio) : nlohmann::json(nullptr)},
          {"decisions", decisions},
          {"interrupted", r.interrupted},
          {"skipped", r.skipped.size()},
          {"skipped_samples", skipped}};
}

}  // namespace stoker
