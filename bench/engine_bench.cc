// Engine overhead: batches/s with trivial samples (batch 64), so that the
// cost measured is the loader's own (claiming, completing, delivering,
// recycling), not the samples'. Compare with bench/torch_engine_bench.py
// (PyTorch DataLoader on an equally trivial dataset) via bench/engine_compare.sh.

#include <benchmark/benchmark.h>

#include "stoker/loader.h"
#include "stoker/synthetic.h"

namespace stoker {
namespace {

void BM_TrivialBatches(benchmark::State& state) {
  SyntheticOptions so;
  so.size = 64 * 4096;
  so.sample_bytes = 8;  // one int64 per sample, like a trivial tensor
  LoaderOptions o;
  o.source = *MakeSyntheticSource(so);
  o.transform = *MakeRawTransform({{1}, DType::kInt64});
  o.batch_size = 64;
  o.shuffle = false;
  o.workers = static_cast<int>(state.range(0));
  o.prefetch_batches = 8;
  auto loader = std::move(Loader::Make(o)).value();
  int64_t batches = 0;
  for (auto _ : state) {
    auto r = loader->Next();
    if (!r.ok()) {
      state.SkipWithError(r.status().ToString().c_str());
      break;
    }
    if (!r->has_value()) continue;  // epoch boundary
    benchmark::DoNotOptimize((*r)->data().data());
    ++batches;
  }
  state.counters["batches_per_s"] =
      benchmark::Counter(static_cast<double>(batches), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_TrivialBatches)->Arg(0)->Arg(1)->Arg(2)->UseRealTime()->MinTime(2.0);

}  // namespace
}  // namespace stoker

BENCHMARK_MAIN();
