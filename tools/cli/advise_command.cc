#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "command_output.h"
#include "commands.h"
#include "option_checks.h"
#include "stoker/advisor.h"
#include "stoker/probe.h"

namespace stoker::cli {
namespace {

struct AdviseCommandOptions {
  std::string data_path;
  int64_t batch_size = 0;    // 0: not given
  int64_t sample_bytes = 0;  // 0: not given
  WorkersKind workers_kind = WorkersKind::kThreads;
  bool no_gpus = false;
  bool json = false;
};

int RunAdvise(const AdviseCommandOptions& o) {
  ProbeOptions probe;
  if (!o.data_path.empty()) probe.data_path = o.data_path;
  probe.skip_gpus = o.no_gpus;
  MachineFacts facts = ProbeMachine(probe);
  AdviseInputs inputs;
  if (o.batch_size > 0) inputs.batch_size = o.batch_size;
  if (o.sample_bytes > 0) inputs.sample_bytes = static_cast<size_t>(o.sample_bytes);
  inputs.workers_kind = o.workers_kind;
  Advice advice = Advise(facts, inputs);
  const bool processes = o.workers_kind == WorkersKind::kProcesses;
  // Who the advice is for: thread workers are stoker's native pipeline's.
  // /dev/shm binds torch's DataLoader only (stoker.DataLoader's batches are
  // memfds): where it lowered the advice, the advice is torch's.
  const bool shm_bound = std::any_of(advice.rules.begin(), advice.rules.end(), [](const auto& r) {
    return r.name == "shared memory" && r.limited;
  });
  const std::string advised_for =
      !processes
          ? std::string(LoaderKindName(LoaderKind::kNative)) + " and stoker run (worker threads)"
      : shm_bound ? "worker processes (torch.utils.data.DataLoader; stoker.DataLoader's batches "
                    "are not in /dev/shm, so its shared memory rule does not bind it)"
                  : "worker processes (torch.utils.data.DataLoader, stoker.DataLoader)";
  // torch's DataLoader runs processes, whatever kind the advice above is for.
  AdviseInputs for_torch = inputs;
  for_torch.workers_kind = WorkersKind::kProcesses;
  const Advice torch_advice = Advise(facts, for_torch);
  const LoaderArgs torch_args =
      LoaderArgsFromAdvice(LoaderKind::kTorchDataLoader, torch_advice.workers,
                           torch_advice.prefetch_batches, static_cast<int>(facts.gpus.size()));
  if (o.json) {
    nlohmann::json j = AdviceToJson(advice, inputs);
    j["for"] = advised_for;
    j["basis"] = torch_args.basis;
    j["dataloader"] = torch_advice.fits ? LoaderArgsToJson(torch_args) : nlohmann::json();
    j["facts"] = FactsToJson(facts);
    PrintJson(j);
    return 0;
  }
  std::cout << "stoker advise: " << torch_args.basis << ".\n";
  if (advice.fits) {
    std::cout << "For " << advised_for << ": start with " << advice.workers
              << (processes ? " worker process" : " worker thread")
              << (advice.workers == 1 ? "" : "s") << " and " << advice.prefetch_batches
              << (advice.prefetch_batches == 1 ? " batch" : " batches") << " of prefetch ("
              << FormatBytes(advice.prefetch_bytes) << "), within a memory budget of "
              << FormatBytes(advice.memory_budget_bytes) << ".\n\n";
  } else {
    std::cout << "For " << advised_for << ": no setting fits: a loader holds 2 batches of "
              << FormatBytes(advice.batch_bytes) << ", over the memory budget of "
              << FormatBytes(advice.memory_budget_bytes) << "; reduce the batch size.\n\n";
  }
  size_t width = 0;
  for (const AdviceRule& r : advice.rules) width = std::max(width, r.name.size());
  for (const AdviceRule& r : advice.rules) {
    std::string pad(width + 4, ' ');
    std::cout << "  " << r.name << std::string(width - r.name.size() + 2, ' ') << r.input << "\n"
              << pad << (r.limited ? "=> " : "-> ") << r.outcome << "\n";
  }
  std::cout << "\n(=> marks a rule that lowered the advice.)\n" << advice.note << "\n";
  if (torch_advice.fits) std::cout << "\n" << torch_args.Text();
  if (!facts.notes.empty()) {
    std::cout << "\nunreadable facts (treated as unknown):\n";
    for (const std::string& note : facts.notes) std::cout << "  " << note << "\n";
  }
  return 0;
}

}  // namespace

void AddAdviseCommand(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<AdviseCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "advise",
      "Suggest a starting worker count and prefetch depth for this machine, with reasons.");
  cmd->add_option("--data", opts->data_path, "path of the data set (its storage shapes the advice)")
      ->check(ExistingPlace());
  cmd->add_option("--batch-size", opts->batch_size, "samples per batch (default: assume 64)")
      ->check(CountIn(1, kMaxBatchSize));
  cmd->add_option("--sample-bytes", opts->sample_bytes,
                  "bytes of one transformed sample (default: assume 3x224x224 uint8)")
      ->check(CountIn(1, kMaxSampleBytes));
  // Checked by name first (the message names the choices), then mapped: a
  // transform added later runs earlier.
  const std::map<std::string, WorkersKind> kinds = {{"threads", WorkersKind::kThreads},
                                                    {"processes", WorkersKind::kProcesses}};
  cmd->add_option("--workers-kind", opts->workers_kind, "threads (stoker) or processes (PyTorch)")
      ->transform(CLI::Transformer(kinds, CLI::ignore_case))
      ->transform(CLI::IsMember({"threads", "processes"}, CLI::ignore_case));
  cmd->add_flag("--no-gpus", opts->no_gpus, "skip the NVML query");
  cmd->add_flag("--json", opts->json, "print JSON on stdout");
  cmd->callback([opts, &exit_code] { exit_code = RunAdvise(*opts); });
}

}  // namespace stoker::cli
