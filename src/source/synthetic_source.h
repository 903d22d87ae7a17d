#pragma once

#include <vector>

#include "stoker/synthetic.h"

namespace stoker {

/// See MakeSyntheticSource. Immutable; Read is safe from many threads.
class SyntheticSource final : public Source {
 public:
  explicit SyntheticSource(SyntheticOptions options);

  int64_t size() const override { return options_.size; }
  Status Read(int64_t index, ReadBuffer& buffer, Record* record) const override;
  std::string Key(int64_t index) const override;

  /// The bytes record `index` holds, written into `out` (sample_bytes long).
  void Fill(int64_t index, std::span<std::byte> out) const;

 private:
  SyntheticOptions options_;
  std::vector<int64_t> fail_sorted_;
};

}  // namespace stoker
