#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "stoker/report.h"

namespace stoker {
namespace {

SweepReport Example() {
  SweepReport r;
  r.sweep = {{0, 100, 1}, {1, 180, 1}, {2, 350, 1}, {3, 352, 1}};
  r.best_static = r.sweep[3];
  r.tuned_samples_per_s = 345;
  r.tuned_workers_final = 2;
  r.tuned_workers_max = 3;
  r.seconds_to_95pct = 1.5;
  r.ratio = 345.0 / 352;
  r.tuned_timeline = {{0.5, 150, 1, 1, 4}, {1.0, 300, 1, 2, 4}, {1.5, 349, 1, 2, 4}};
  TunerDecision d;
  d.reason = "model";
  d.workers_before = 1;
  d.workers_after = 2;
  r.trace = {d};
  return r;
}

TEST(ReportTest, JsonHasTheStableKeys) {
  auto j = SweepToJson(Example());
  ASSERT_EQ(j["sweep"].size(), 4u);
  EXPECT_EQ(j["sweep"][2]["workers"], 2);
  EXPECT_EQ(j["best_static"]["workers"], 3);
  EXPECT_DOUBLE_EQ(j["tuned"]["samples_per_s"].get<double>(), 345);
  EXPECT_EQ(j["tuned"]["workers_final"], 2);
  EXPECT_DOUBLE_EQ(j["tuned"]["seconds_to_95pct"].get<double>(), 1.5);
  EXPECT_NEAR(j["ratio"].get<double>(), 0.98, 0.001);
  EXPECT_EQ(j["decisions"][0]["reason"], "model");
  SweepReport never = Example();
  never.seconds_to_95pct = -1;
  EXPECT_TRUE(SweepToJson(never)["tuned"]["seconds_to_95pct"].is_null());
}

TEST(ReportTest, TableMarksTheBest) {
  std::string t = FormatSweepTable(Example());
  EXPECT_NE(t.find("<- best"), std::string::npos);
  EXPECT_NE(t.find("tuned"), std::string::npos);
  EXPECT_NE(t.find("1.5 s"), std::string::npos);
}

TEST(ReportTest, SvgIsAWholeDocumentWithBothPanels) {
  std::string svg = SweepToSvg(Example(), "test");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("static sweep"), std::string::npos);
  EXPECT_NE(svg.find("tuned:"), std::string::npos);
}

}  // namespace
}  // namespace stoker
