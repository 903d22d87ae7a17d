// Fuzzes the tar reader: IndexTarBytes must never crash, hang or read outside
// its input, and every member it lists must lie inside the input.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "source/tar_shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto entries = stoker::IndexTarBytes(bytes, "fuzz.tar");
  if (!entries.ok()) return 0;
  for (const stoker::TarEntry& entry : *entries) {
    if (entry.offset > size || entry.size > size - entry.offset) std::abort();
    auto [key, ext] = stoker::SplitSampleKey(entry.name);
    if (key.size() + ext.size() > entry.name.size()) std::abort();
  }
  return 0;
}
