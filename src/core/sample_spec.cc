#include "stoker/sample_spec.h"

#include <string>

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

Status SampleSpec::Check(std::string_view what) const {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  text += shape.size() == 1 ? ",)" : ")";
  const std::string named = std::string(what) + " " + text;
  if (shape.empty()) return InvalidArgument(named + " has no dimension: give at least one");
  int64_t n = static_cast<int64_t>(DTypeSize(dtype));
  for (int64_t d : shape) {
    if (d < 1) return InvalidArgument(named + ": every dimension must be >= 1");
    if (__builtin_mul_overflow(n, d, &n)) {
      return InvalidArgument(named + " of " + DTypeName(dtype) +
                             " is more bytes than a 64-bit size holds");
    }
  }
  return Status::Ok();
}

int64_t SampleSpec::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace stoker
