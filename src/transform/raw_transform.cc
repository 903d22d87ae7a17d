#include <cstring>
#include <string>

#include "stoker/synthetic.h"

namespace stoker {
namespace {

class RawTransform final : public Transform {
 public:
  RawTransform(SampleSpec spec, bool mix_rng) : spec_(std::move(spec)), mix_rng_(mix_rng) {}

  SampleSpec spec() const override { return spec_; }

  Status Apply(const Record& record, SampleRng& rng, std::span<std::byte> out,
               TransformScratch*) const override {
    if (record.bytes.size() != out.size()) {
      return DataError("record has " + std::to_string(record.bytes.size()) +
                       " bytes, the sample spec needs " + std::to_string(out.size()));
    }
    std::memcpy(out.data(), record.bytes.data(), out.size());
    if (mix_rng_) {
      for (size_t i = 0; i + 8 <= out.size(); i += 8) {
        uint64_t word;
        std::memcpy(&word, out.data() + i, 8);
        word ^= rng.NextU64();
        std::memcpy(out.data() + i, &word, 8);
      }
    }
    return Status::Ok();
  }

 private:
  SampleSpec spec_;
  bool mix_rng_;
};

}  // namespace

Result<std::shared_ptr<const Transform>> MakeRawTransform(SampleSpec spec, bool mix_rng) {
  STOKER_RETURN_IF_ERROR(spec.Check("raw transform: sample shape"));
  return std::shared_ptr<const Transform>(std::make_shared<RawTransform>(std::move(spec), mix_rng));
}

}  // namespace stoker
