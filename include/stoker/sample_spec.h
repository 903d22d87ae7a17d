#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker {

/// Element type of a sample's output.
enum class DType { kUInt8, kFloat32, kInt64 };

/// Bytes per element of `dtype`.
size_t DTypeSize(DType dtype);
/// "uint8", "float32", "int64".
const char* DTypeName(DType dtype);

/// The fixed shape of one output sample; every sample of a loader has it.
struct SampleSpec {
  std::vector<int64_t> shape;  // e.g. {3, 224, 224} for CHW images
  DType dtype = DType::kUInt8;

  int64_t elements() const;
  size_t bytes() const { return static_cast<size_t>(elements()) * DTypeSize(dtype); }
  /// InvalidArgument naming `what` unless the shape has a dimension, each
  /// at least 1, and its bytes fit in an int64 (bytes() is then exact).
  Status Check(std::string_view what) const;
};

}  // namespace stoker
