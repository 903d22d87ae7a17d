#include "stoker/sample_spec.h"

namespace stoker {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
      return 1;
    case DType::kFloat32:
      return 4;
    case DType::kInt64:
      return 8;
  }
  return 1;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
      return "uint8";
    case DType::kFloat32:
      return "float32";
    case DType::kInt64:
      return "int64";
  }
  return "?";
}

int64_t SampleSpec::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace stoker
