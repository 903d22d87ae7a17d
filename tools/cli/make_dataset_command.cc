#include <algorithm>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "command_output.h"
#include "commands.h"
#include "option_checks.h"
#include "stoker/dataset.h"
#include "stop_signals.h"

namespace stoker::cli {
namespace {

struct MakeDatasetFlags {
  MakeDatasetOptions options;
  std::vector<std::string> given;  // of kShapeOptions, those on the line
  bool json = false;
};

// What the data set is made of: OUT's, never the built-in one's (which has
// its own settings, shared by every command that uses it).
constexpr const char* kShapeOptions[] = {"--images", "--classes", "--seed", "--shards", "--photos"};

// The counts that --images bounds, named as the options they came from (the
// maker's own check names its fields), a default not typed said to be one.
Status CheckCountsFitImages(const MakeDatasetFlags& flags) {
  auto named = [&flags](const std::string& option, int64_t value) {
    const bool typed =
        std::find(flags.given.begin(), flags.given.end(), option) != flags.given.end();
    return option + " " + std::to_string(value) + (typed ? "" : " (the default)");
  };
  const MakeDatasetOptions& o = flags.options;
  const std::string images = named("--images", o.images);
  if (o.classes > o.images) {
    return InvalidArgument(named("--classes", o.classes) + " is more than " + images +
                           ": each class needs an image");
  }
  if (o.shards > o.images) {
    return InvalidArgument(named("--shards", o.shards) + " is more than " + images +
                           ": each shard needs an image");
  }
  return Status::Ok();
}

int RunMakeDataset(const MakeDatasetFlags& flags) {
  // SIGINT and SIGTERM stop it between images, and the half-made folder goes.
  if (flags.options.output.empty()) {
    // No OUT: the built-in data set, made once where demo and run look for it.
    if (!flags.given.empty()) {
      const std::string& option = flags.given.front();
      return ReportError("make-dataset",
                         InvalidArgument(option +
                                         " is for a data set made in OUT: the built-in one "
                                         "(no OUT) has its own settings; name OUT to use " +
                                         option),
                         flags.json);
    }
    auto path = StoppedBySignals(
        [&](std::function<bool()> stop) { return EnsureDefaultDataset(flags.json, stop); });
    if (!path.ok()) return ReportError("make-dataset", path.status(), flags.json);
    if (flags.json) {
      PrintJson({{"root", *path}});
    } else {
      std::cout << *path << "\n";
    }
    return 0;
  }
  if (Status st = CheckCountsFitImages(flags); !st.ok()) {
    return ReportError("make-dataset", st, flags.json);
  }
  auto report = StoppedBySignals([&](std::function<bool()> stop) {
    MakeDatasetOptions options = flags.options;
    options.stop = std::move(stop);
    return MakeDataset(options);
  });
  if (!report.ok()) return ReportError("make-dataset", report.status(), flags.json);
  const MakeDatasetReport& r = *report;
  nlohmann::json j = {{"root", r.root},
                      {"images", r.images},
                      {"classes", r.class_names.size()},
                      {"class_names", r.class_names},
                      {"bytes", r.bytes},
                      {"mean_pixels", r.mean_pixels},
                      {"photos_used", r.photos_used},
                      {"seed", flags.options.seed},
                      {"shards", r.shard_paths},
                      {"seconds", r.seconds}};
  if (flags.json) {
    PrintJson(j);
    return 0;
  }
  std::cout << "stoker make-dataset: wrote " << r.images << " images in " << r.class_names.size()
            << " classes to " << r.root << "/\n"
            << "  photographs    " << r.photos_used << " (from " << flags.options.photos << ")\n"
            << "  size           " << static_cast<double>(r.bytes) / 1e6 << " MB, "
            << static_cast<double>(r.bytes) / static_cast<double>(r.images) / 1e3
            << " kB per image\n"
            << "  mean pixels    " << r.mean_pixels / 1e6 << " MP\n"
            << "  seed           " << flags.options.seed << "\n";
  if (!r.shard_paths.empty()) {
    std::cout << "  shards         " << r.shard_paths.size() << ": " << r.shard_paths.front();
    if (r.shard_paths.size() > 1) std::cout << " ... " << r.shard_paths.back();
    std::cout << "\n";
  }
  std::cout << "  seconds        " << r.seconds << "\n";
  return 0;
}

}  // namespace

void AddMakeDatasetCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<MakeDatasetFlags>();
  MakeDatasetOptions& o = flags->options;
  CLI::App* cmd = app.add_subcommand(
      "make-dataset",
      "Write an ImageNet-like JPEG folder data set (OUT/<class>/*.jpg) cut from the installed "
      "wallpaper photographs; the demo's and benchmarks' default data.");
  cmd->add_option("OUT", o.output,
                  "folder to write; without it, the built-in data set (made if missing) and its "
                  "path printed")
      ->check(PathGiven());
  cmd->add_option("--images", o.images, "number of images")
      ->capture_default_str()
      ->check(CountIn(1, kMaxImages));
  cmd->add_option("--classes", o.classes, "number of classes (n000, n001, ...)")
      ->capture_default_str()
      ->check(CountIn(1, kMaxImages));
  cmd->add_option("--seed", o.seed, "same seed, byte-identical files")
      ->capture_default_str()
      ->check(CountIn(0, UINT64_MAX));
  cmd->add_option("--shards", o.shards,
                  "also write the images as K WebDataset tar shards in OUT-shards/")
      ->capture_default_str()
      ->check(CountIn(0, kMaxImages));
  cmd->add_option("--photos", o.photos, "folder of */contents/images*/ photographs")
      ->capture_default_str()
      ->check(PathGiven());
  cmd->add_flag("--json", flags->json, "print JSON on stdout");
  cmd->callback([cmd, flags, &exit_code] {
    for (const char* name : kShapeOptions) {
      if (cmd->get_option(name)->count() > 0) flags->given.push_back(name);
    }
    exit_code = RunMakeDataset(*flags);
  });
}

}  // namespace stoker::cli
