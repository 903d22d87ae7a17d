// Single-thread image path: the "physical limit" (whole-JPEG decode from
// memory with libjpeg-turbo, images/s on one core) next to stoker's fused
// transforms on the same files. Run side by side in one process; compare the
// items_per_second of each.
//
// Data: the JPEGs under $STOKER_BENCH_DATA (recursively), or else 256 images
// made with MakeDataset (from the installed wallpapers) in a temp folder.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "stoker/dataset.h"
#include "stoker/image.h"
#include "transform/jpeg_decoder.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

struct Corpus {
  std::vector<std::vector<uint8_t>> files;
  std::string origin;
  std::string error;
};

std::vector<uint8_t> ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void LoadJpegs(const std::string& root, Corpus* c) {
  std::vector<fs::path> paths;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::string ext = it->path().extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
    if (it->is_regular_file() && (ext == ".jpg" || ext == ".jpeg")) paths.push_back(it->path());
  }
  std::sort(paths.begin(), paths.end());
  for (const auto& p : paths) c->files.push_back(ReadAll(p));
}

const Corpus& GetCorpus() {
  static const Corpus corpus = [] {
    Corpus c;
    if (const char* dir = std::getenv("STOKER_BENCH_DATA"); dir != nullptr && *dir != '\0') {
      c.origin = dir;
      LoadJpegs(dir, &c);
    } else {
      fs::path tmp = fs::temp_directory_path() / ("stoker-image-bench-" + std::to_string(getpid()));
      MakeDatasetOptions o;
      o.output = tmp.string();
      o.images = 256;
      o.classes = 8;
      auto made = MakeDataset(o);
      if (!made.ok()) {
        c.error = made.status().ToString();
        return c;
      }
      c.origin = "MakeDataset(256 images, seed 0)";
      LoadJpegs(o.output, &c);
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    if (c.files.empty() && c.error.empty()) c.error = "no .jpg files in " + c.origin;
    if (c.error.empty()) {
      std::fprintf(stderr, "image_bench: %zu JPEGs from %s\n", c.files.size(), c.origin.c_str());
    }
    return c;
  }();
  return corpus;
}

std::span<const std::byte> Bytes(const std::vector<uint8_t>& v) {
  return std::as_bytes(std::span<const uint8_t>(v));
}

// The physical limit: decode every pixel of every file, nothing else.
void BM_FullDecode(benchmark::State& state) {
  const Corpus& c = GetCorpus();
  if (!c.error.empty()) {
    state.SkipWithError(c.error.c_str());
    return;
  }
  JpegDecoder dec;
  std::vector<uint8_t> pixels;
  DecodedRegion r;
  size_t i = 0;
  int64_t decoded_pixels = 0;
  for (auto _ : state) {
    const auto& f = c.files[i++ % c.files.size()];
    if (!dec.DecodeFull(Bytes(f), 1, &pixels, &r).ok()) {
      state.SkipWithError("decode failed");
      return;
    }
    decoded_pixels += static_cast<int64_t>(r.width) * r.height;
    benchmark::DoNotOptimize(pixels.data());
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["MP/s"] =
      benchmark::Counter(static_cast<double>(decoded_pixels) / 1e6, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_FullDecode)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// What a sample costs before any pixel is decoded: the header parse and the
// check that the data reaches its EOI marker.
void BM_ReadHeader(benchmark::State& state) {
  const Corpus& c = GetCorpus();
  if (!c.error.empty()) {
    state.SkipWithError(c.error.c_str());
    return;
  }
  JpegDecoder dec;
  size_t i = 0;
  int64_t bytes = 0;
  for (auto _ : state) {
    const auto& f = c.files[i++ % c.files.size()];
    if (!dec.ReadHeader(Bytes(f)).ok()) {
      state.SkipWithError("header failed");
      return;
    }
    bytes += static_cast<int64_t>(f.size());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(bytes);
}
BENCHMARK(BM_ReadHeader)->MinTime(1.0);

void RunTransform(benchmark::State& state, const ImageTransformOptions& o) {
  const Corpus& c = GetCorpus();
  if (!c.error.empty()) {
    state.SkipWithError(c.error.c_str());
    return;
  }
  auto t = MakeImageTransform(o);
  if (!t.ok()) {
    state.SkipWithError(t.status().ToString().c_str());
    return;
  }
  auto scratch = (*t)->NewScratch();
  std::vector<float> out((*t)->spec().bytes() / sizeof(float) + 1);
  std::span<std::byte> span(reinterpret_cast<std::byte*>(out.data()), (*t)->spec().bytes());
  uint64_t i = 0;
  for (auto _ : state) {
    const auto& f = c.files[i % c.files.size()];
    SampleRng rng(1, 0, i++);
    Status s = (*t)->Apply(Record{Bytes(f), 0}, rng, span, scratch.get());
    if (!s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());
}

// RandomResizedCrop(224) + flip + normalise, float32 CHW: the training path.
void BM_FusedTrain(benchmark::State& state) { RunTransform(state, ImageTransformOptions{}); }
BENCHMARK(BM_FusedTrain)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// The same with DCT scaling (opt-in): what the coarser decode buys over the
// exact default; the ratio of the two is the cost of fidelity.
void BM_FusedTrainDctScaled(benchmark::State& state) {
  ImageTransformOptions o;
  o.dct_scaling = true;
  RunTransform(state, o);
}
BENCHMARK(BM_FusedTrainDctScaled)->Unit(benchmark::kMillisecond)->MinTime(2.0);

// Resize(256) + CenterCrop(224) + normalise: the evaluation path.
void BM_FusedEval(benchmark::State& state) {
  ImageTransformOptions o;
  o.mode = ImageMode::kEval;
  RunTransform(state, o);
}
BENCHMARK(BM_FusedEval)->Unit(benchmark::kMillisecond)->MinTime(2.0);

void BM_FusedEvalDctScaled(benchmark::State& state) {
  ImageTransformOptions o;
  o.mode = ImageMode::kEval;
  o.dct_scaling = true;
  RunTransform(state, o);
}
BENCHMARK(BM_FusedEvalDctScaled)->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace
}  // namespace stoker

BENCHMARK_MAIN();
