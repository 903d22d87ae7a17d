#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "stoker/loader.h"
#include "stoker/synthetic.h"

namespace stoker::cli {
namespace {

struct DemoOptions {
  int64_t samples = 20000;
  int64_t batch_size = 64;
  int workers = 2;
  double cpu_us = 50;
  double step_ms = 0;
  int epochs = 2;
  bool json = false;
};

int RunDemo(const DemoOptions& o) {
  SyntheticOptions so;
  so.size = o.samples;
  so.sample_bytes = 3 * 32 * 32;
  so.cpu_cost = std::chrono::nanoseconds(static_cast<int64_t>(o.cpu_us * 1000));
  auto source = MakeSyntheticSource(so);
  auto transform = MakeRawTransform({{3, 32, 32}, DType::kUInt8}, /*mix_rng=*/true);
  if (!source.ok() || !transform.ok()) {
    std::cerr << "stoker demo: " << (source.ok() ? transform.status() : source.status()).ToString()
              << "\n";
    return 2;
  }
  LoaderOptions lo;
  lo.source = *source;
  lo.transform = *transform;
  lo.batch_size = o.batch_size;
  lo.workers = o.workers;
  auto loader = Loader::Make(lo);
  if (!loader.ok()) {
    std::cerr << "stoker demo: " << loader.status().ToString() << "\n";
    return 2;
  }
  auto start = std::chrono::steady_clock::now();
  int64_t samples = 0;
  for (int e = 0; e < o.epochs; ++e) {
    while (true) {
      auto batch = (*loader)->Next();
      if (!batch.ok()) {
        std::cerr << "stoker demo: " << batch.status().ToString() << "\n";
        return 1;
      }
      if (!batch->has_value()) break;
      samples += (*batch)->size();
      if (o.step_ms > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(o.step_ms * 1000)));
      }
    }
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  LoaderMetrics m = (*loader)->Metrics();
  double wait_s = static_cast<double>(m.consumer_wait_ns) * 1e-9;
  nlohmann::json j = {{"samples", samples},
                      {"seconds", seconds},
                      {"samples_per_s", static_cast<double>(samples) / seconds},
                      {"stall_fraction", seconds > 0 ? wait_s / seconds : 0.0},
                      {"workers_final", (*loader)->workers()}};
  if (o.json) {
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << "stoker demo (synthetic source, " << o.workers << " workers)\n"
              << "  samples        " << samples << "\n"
              << "  seconds        " << seconds << "\n"
              << "  samples/s      " << j["samples_per_s"].get<double>() << "\n"
              << "  consumer stall " << 100.0 * j["stall_fraction"].get<double>() << " %\n";
  }
  return 0;
}

}  // namespace

void AddDemoCommand(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<DemoOptions>();
  CLI::App* cmd = app.add_subcommand("demo", "Run the loader end to end on built-in data.");
  cmd->add_option("--samples", opts->samples, "samples per epoch")->check(CLI::PositiveNumber);
  cmd->add_option("--batch-size", opts->batch_size, "samples per batch")->check(CLI::PositiveNumber);
  cmd->add_option("--workers", opts->workers, "worker threads")->check(CLI::NonNegativeNumber);
  cmd->add_option("--cpu-us", opts->cpu_us, "CPU work per sample, microseconds")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--step-ms", opts->step_ms, "simulated training step per batch, ms")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--epochs", opts->epochs, "epochs")->check(CLI::PositiveNumber);
  cmd->add_flag("--json", opts->json, "print JSON on stdout");
  cmd->callback([opts, &exit_code] { exit_code = RunDemo(*opts); });
}

}  // namespace stoker::cli
