// Fuzzes DumpJson, the one writer of stoker's JSON: the CLI's summaries,
// error objects, probe output and trace lines carry paths and tar member
// names, which may hold any bytes, in values and in keys. It must never
// throw, must always write valid UTF-8, and must write exactly what
// nlohmann's dump() writes whenever dump() can (all strings valid UTF-8),
// a text that parses back to the same value.

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "stoker/json_text.h"
#include "stoker/probe.h"
#include "stoker/report.h"
#include "stoker/tuner.h"

namespace {

nlohmann::json Build(FuzzedDataProvider& in) {
  nlohmann::json j = nlohmann::json::object();
  // The random key lives in an object of its own: at top level it could name
  // "nested" and make the indexing below a type error of the harness.
  j["pair"][in.ConsumeRandomLengthString(64)] = in.ConsumeRandomLengthString(64);
  j["list"] = {in.ConsumeRandomLengthString(32), in.ConsumeIntegral<int64_t>(),
               in.ConsumeFloatingPoint<double>(), nullptr, in.ConsumeBool()};
  j["nested"][in.ConsumeRandomLengthString(32)][in.ConsumeRandomLengthString(32)] =
      in.ConsumeRandomLengthString(32);
  // The records whose strings come from files and folders.
  stoker::SkipRecord skip{in.ConsumeIntegral<int64_t>(), in.ConsumeIntegral<int64_t>(),
                          in.ConsumeRandomLengthString(64), in.ConsumeRandomLengthString(64)};
  j["skipped_samples"] = nlohmann::json::array({stoker::SkipRecordToJson(skip)});
  stoker::TunerDecision decision;
  decision.reason = in.ConsumeRandomLengthString(64);
  decision.samples_per_s = in.ConsumeFloatingPoint<double>();
  j["decision"] = stoker::TunerDecisionToJson(decision);
  stoker::MachineFacts facts;
  facts.storage = stoker::MachineFacts::Storage{};
  facts.storage->path = in.ConsumeRandomLengthString(64);
  facts.storage->mount_point = in.ConsumeRandomLengthString(32);
  facts.notes.push_back(in.ConsumeRemainingBytesAsString());
  j["facts"] = stoker::FactsToJson(facts);
  return j;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const nlohmann::json j = Build(in);
  for (int indent : {-1, 2}) {
    const std::string text = stoker::DumpJson(j, indent);  // an exception aborts the fuzzer
    // dump() of a string holding the text checks that the text is UTF-8.
    try {
      nlohmann::json(text).dump();
    } catch (const nlohmann::json::exception&) {
      std::abort();
    }
    std::string plain;
    try {
      plain = j.dump(indent);
    } catch (const nlohmann::json::type_error&) {
      continue;  // some string is not UTF-8: escaped, which dump() cannot do
    }
    if (text != plain) std::abort();
    if (nlohmann::json::parse(text) != j) std::abort();
  }
  return 0;
}
