#include "stoker/report.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "stoker/tuner.h"

namespace stoker {
namespace {

SweepReport Example() {
  SweepReport r;
  r.sweep = {{0, 100, 1}, {1, 180, 1}, {2, 350, 1}, {3, 352, 1}};
  r.best_static = r.recommended = r.sweep[3];
  r.tuned_measured = true;
  r.tuned_samples_per_s = 345;
  r.tuned_workers_final = 2;
  r.tuned_workers_max = 3;
  r.seconds_to_95pct = 1.5;
  r.ratio = 345.0 / 352;
  r.tuned_timeline = {{.t_s = 0.5,
                       .samples_per_s = 150,
                       .produced_per_s = 160,
                       .stall_fraction = 1,
                       .workers = 1,
                       .prefetch_batches = 4},
                      {.t_s = 1.0,
                       .samples_per_s = 300,
                       .produced_per_s = 310,
                       .stall_fraction = 1,
                       .workers = 2,
                       .prefetch_batches = 4},
                      {.t_s = 1.5,
                       .samples_per_s = 349,
                       .produced_per_s = 349,
                       .stall_fraction = 1,
                       .workers = 2,
                       .prefetch_batches = 4}};
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
  ASSERT_EQ(j["tuned"]["timeline"].size(), 3u);
  EXPECT_DOUBLE_EQ(j["tuned"]["timeline"][1]["t_s"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["tuned"]["timeline"][1]["samples_per_s"].get<double>(), 300);
  EXPECT_EQ(j["tuned"]["timeline"][1]["workers"], 2);
  EXPECT_DOUBLE_EQ(j["tuned"]["timeline"][1]["produced_per_s"].get<double>(), 310);
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

TEST(ReportTest, TheTunedLinesReadAsSentences) {
  // "settled on 1 workers", and "reached after never".
  SweepReport r = Example();
  r.tuned_workers_final = 1;
  r.seconds_to_95pct = -1;
  const std::string t = FormatSweepTable(r);
  EXPECT_NE(t.find("settled on 1 worker (max 3)"), std::string::npos) << t;
  EXPECT_NE(t.find("; 95 % of the best never reached\n"), std::string::npos) << t;
  const std::string reached = FormatSweepTable(Example());
  EXPECT_NE(reached.find("settled on 2 workers (max 3)"), std::string::npos) << reached;
  EXPECT_NE(reached.find("; 95 % of the best reached after 1.5 s\n"), std::string::npos) << reached;
}

TEST(ReportTest, AnInterruptedSweepShowsThePointsMeasuredAndSaysSo) {
  SweepReport r = Example();
  r.sweep.resize(2);
  r.best_static = r.recommended = r.sweep[1];
  r.tuned_measured = false;
  r.interrupted = true;
  const std::string t = FormatSweepTable(r);
  EXPECT_NE(t.find("180.0"), std::string::npos) << t;
  EXPECT_EQ(t.find("350.0"), std::string::npos) << t;
  EXPECT_NE(t.find("interrupted: 2 counts measured"), std::string::npos) << t;
  EXPECT_EQ(t.find("tuned /"), std::string::npos) << t;
  const auto j = SweepToJson(r);
  EXPECT_TRUE(j["interrupted"].get<bool>());
  EXPECT_EQ(j["sweep"].size(), 2u);
  EXPECT_EQ(j["best_static"]["workers"], 1);
  EXPECT_TRUE(j["tuned"].is_null());
  EXPECT_TRUE(j["ratio"].is_null());
  EXPECT_FALSE(SweepToJson(Example())["interrupted"].get<bool>());
}

TEST(ReportTest, ASkippedNameIsOneLineOfTheList) {
  // A newline in a file's name made one skipped file read as two.
  SweepReport r = Example();
  r.skipped = {{.epoch = 0, .index = 3, .key = "a\nb\t.jpg", .reason = "bad\x1b[31m"}};
  const std::string t = FormatSweepTable(r);
  EXPECT_NE(t.find("a\\x0ab\\x09.jpg: bad\\x1b[31m"), std::string::npos) << t;
  EXPECT_EQ(Printable("one\ntwo\t"), "one\ntwo\t");
}

TEST(ReportTest, BytesThatAreNotUtf8AreEscapedAndUtf8IsKept) {
  // A file name's raw bytes (ff fe) reached the terminal as they were, shown
  // as replacement characters that cannot be typed back.
  EXPECT_EQ(PrintableLine("zero\xff\xfe.jpg"), "zero\\xff\\xfe.jpg");
  EXPECT_EQ(PrintableLine("caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x93\xb7"),
            "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x93\xb7");  // é, 日, a camera
  // Overlong, surrogate, cut short, past U+10FFFF: escaped byte by byte.
  EXPECT_EQ(PrintableLine("\xc0\xaf|\xed\xa0\x80|\xe6\x97|\xf4\x90\x80\x80"),
            "\\xc0\\xaf|\\xed\\xa0\\x80|\\xe6\\x97|\\xf4\\x90\\x80\\x80");
  EXPECT_EQ(PrintableLine("del\x7f"), "del\\x7f");
}

TEST(ReportTest, SvgCountsWorkersInWholeNumbers) {
  SweepReport r = Example();
  r.sweep = {{1, 100, 0}, {2, 180, 0}, {3, 250, 0}, {4, 300, 0}, {5, 310, 0}};
  const std::string svg = SweepToSvg(r, "five");
  for (const char* half : {">1.2<", ">2.5<", ">3.8<"}) {
    EXPECT_EQ(svg.find(half), std::string::npos) << half;  // quarter ticks of 0..5
  }
  EXPECT_NE(svg.find(">2<"), std::string::npos);
  EXPECT_NE(svg.find(">4<"), std::string::npos);
}

TEST(ReportTest, SvgIsAWholeDocumentWithBothPanels) {
  std::string svg = SweepToSvg(Example(), "test");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("static sweep"), std::string::npos);
  EXPECT_NE(svg.find("tuned:"), std::string::npos);
}

// The y of every circle drawn, in document order.
std::vector<double> CircleYs(const std::string& svg) {
  std::vector<double> ys;
  for (size_t at = svg.find("<circle"); at != std::string::npos; at = svg.find("<circle", at + 1)) {
    ys.push_back(std::stod(svg.substr(svg.find("cy='", at) + 4)));
  }
  return ys;
}

TEST(ReportTest, SvgDrawsEveryPointInsideItsFrameAndRingsTheTablesBest) {
  // The reference measured again after the tuned run read lower than the
  // sweep's rows: the axis was sized from it, and the rows fell above the
  // frame (y < 45), some of them off the canvas.
  SweepReport r = Example();
  r.recommended = r.sweep[2];  // 350, within 3 % of 352: the fewest workers
  r.best_static = {3, 180, 1};
  const std::string svg = SweepToSvg(r, "low reference");
  const std::vector<double> ys = CircleYs(svg);
  ASSERT_EQ(ys.size(), r.sweep.size() + 1);  // the points, then the ring
  for (double y : ys) EXPECT_GE(y, 45) << svg;
  EXPECT_EQ(ys.back(), ys[2]);  // on the recommended count's own point
}

TEST(ReportTest, SvgRateTicksAreRoundAndTellTheirValuesApart) {
  // A loader under one sample a second: its points sat at the bottom of a
  // 0..1 axis, and the quarter lines read "0.2" and "0.8".
  SweepReport r;
  r.sweep = {{0, 0.05, 1}, {1, 0.09, 1}, {2, 0.11, 1}};
  r.best_static = r.recommended = r.sweep[2];
  const std::string slow = SweepToSvg(r, "slow");
  for (const char* tick : {">0.05<", ">0.10<", ">0.15<", ">0.20<"}) {
    EXPECT_NE(slow.find(tick), std::string::npos) << tick << "\n" << slow;
  }
  r.sweep = {{0, 100, 1}, {1, 180, 1}, {2, 350, 1}};
  r.best_static = r.recommended = r.sweep[2];
  const std::string fast = SweepToSvg(r, "fast");
  for (const char* tick : {">0<", ">100<", ">200<", ">300<", ">400<"}) {
    EXPECT_NE(fast.find(tick), std::string::npos) << tick << "\n" << fast;
  }
}

TEST(ReportTest, SvgTitleIsXmlTextWhateverItsBytes) {
  const std::string svg = SweepToSvg(Example(), "data/R&D <new> 'a\"\x01\xff");
  EXPECT_NE(svg.find(">data/R&amp;D &lt;new&gt; &apos;a&quot;\\x01\\xff</text>"), std::string::npos)
      << svg;
}

TEST(ReportTest, SvgOfAStaticSweepAloneHasNoTunedPanel) {
  SweepReport r;
  r.sweep = {{0, 100, 1}, {1, 180, 1}, {2, 170, 1}};
  r.best_static = r.recommended = r.sweep[1];
  const std::string svg = SweepToSvg(r, "torch");
  EXPECT_EQ(svg.rfind("<svg xmlns='http://www.w3.org/2000/svg' width='440'", 0), 0u) << svg;
  EXPECT_NE(svg.find("static sweep"), std::string::npos);
  EXPECT_EQ(svg.find("tuned:"), std::string::npos);
  EXPECT_EQ(svg.find("seconds"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(LoaderJsonTest, MetricsHaveEveryCounterAndEachWorker) {
  LoaderMetrics m;
  m.workers_target = 3;
  m.queue_ns = 17;
  m.consumer_wait_ns = 5;
  m.recent.user_samples_delivered = 640;
  m.recent.consumer_step_ns = 7;
  m.bytes_in_flight = size_t{1} << 33;
  m.workers = {{0, 10, 100, 90, 4}, {1, 12, 110, 95, 6}};
  auto j = LoaderMetricsToJson(m);
  for (const char* key : {"time_ns",
                          "workers_target",
                          "workers_running",
                          "workers_remote",
                          "remote_capacity",
                          "remote_task_bytes",
                          "remote_samples_produced",
                          "remote_busy_ns",
                          "prefetch_batches",
                          "prefetch_bytes",
                          "batches_delivered",
                          "samples_delivered",
                          "user_samples_delivered",
                          "samples_produced",
                          "busy_ns",
                          "cpu_ns",
                          "queue_ns",
                          "cpu_elsewhere_ns",
                          "consumer_wait_ns",
                          "consumer_step_ns",
                          "recent",
                          "next_calls",
                          "samples_skipped",
                          "ready_batches",
                          "open_batches",
                          "bytes_in_flight",
                          "batch_bytes",
                          "worker_bytes",
                          "pinned_buffers",
                          "device_copies",
                          "device_copies_at_delivery",
                          "device_prefetched",
                          "device_prefetch_batches",
                          "workers_refused",
                          "workers"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j.size(), 35u);
  EXPECT_EQ(j["workers_target"], 3);
  EXPECT_EQ(j["queue_ns"], 17);
  EXPECT_EQ(j["recent"], nlohmann::json({{"batches_delivered", 0},
                                         {"samples_delivered", 0},
                                         {"user_samples_delivered", 640},
                                         {"consumer_wait_ns", 0},
                                         {"consumer_step_ns", 7}}));
  EXPECT_EQ(j["bytes_in_flight"], size_t{1} << 33);
  ASSERT_EQ(j["workers"].size(), 2u);
  EXPECT_EQ(j["workers"][1]["id"], 1);
  EXPECT_EQ(j["workers"][1]["samples"], 12);
  EXPECT_EQ(j["workers"][1]["busy_ns"], 110);
  EXPECT_EQ(j["workers"][1]["cpu_ns"], 95);
  EXPECT_EQ(j["workers"][1]["queue_ns"], 6);
}

TEST(LoaderJsonTest, SkipRecordKeepsItsFields) {
  auto j = SkipRecordToJson({2, 41, "/data/x.jpg", "data error: truncated"});
  EXPECT_EQ(j, nlohmann::json({{"epoch", 2},
                               {"index", 41},
                               {"key", "/data/x.jpg"},
                               {"reason", "data error: truncated"}}));
}

TEST(LoaderJsonTest, TunerViewCarriesItsLastDecision) {
  TunerView v;
  v.workers = 4;
  v.cpu_budget_workers = 6;
  v.phase = "steady";
  v.decisions = 2;
  auto j = TunerViewToJson(v);
  EXPECT_EQ(j["workers"], 4);
  EXPECT_EQ(j["cpu_budget_workers"], 6);
  EXPECT_EQ(j["phase"], "steady");
  EXPECT_EQ(j["decisions"], 2);
  EXPECT_TRUE(j["last_decision"].is_null());
  for (const char* key : {"prefetch_batches", "max_workers", "memory_budget_bytes", "samples_per_s",
                          "stall_fraction"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  TunerDecision d;
  d.reason = "grow: stall 3 %";
  d.workers_after = 4;
  v.last_decision = d;
  EXPECT_EQ(TunerViewToJson(v)["last_decision"], TunerDecisionToJson(d));
}

// The node's split shows in stats(): this loader's share and the node's
// totals, and without a registry why there is none.
TEST(LoaderJsonTest, TunerViewCarriesTheNodeShare) {
  TunerView v;
  v.node.registry = "/dev/shm/stoker-node-0";
  v.node.share_cores = 1.5;
  v.node.budget_cores = 4;
  v.node.loaders = 3;
  v.node.workers = 7;
  v.node.cpu_cores = 3.2;
  nlohmann::json node = TunerViewToJson(v)["node"];
  EXPECT_EQ(node["registry"], "/dev/shm/stoker-node-0");
  EXPECT_EQ(node["share_cores"], 1.5);
  EXPECT_EQ(node["budget_cores"], 4.0);
  EXPECT_EQ(node["loaders"], 3);
  EXPECT_EQ(node["workers"], 7);
  EXPECT_EQ(node["cpu_cores"], 3.2);
  v.node = {};
  v.node.note = "node registry turned off ($STOKER_NODE_REGISTRY=off)";
  node = TunerViewToJson(v)["node"];
  EXPECT_TRUE(node["registry"].is_null());
  EXPECT_EQ(node["note"], v.node.note);
  TunerDecision d;
  d.cpu_budget_cores = 1.25;
  d.node_loaders = 2;
  EXPECT_EQ(TunerDecisionToJson(d)["cpu_budget_cores"], 1.25);
  EXPECT_EQ(TunerDecisionToJson(d)["node_loaders"], 2);
}

// On a terminal the view redraws one row in place: a line wider than the
// terminal wrapped, and every redraw left its wrapped rows behind (an
// 80-column terminal got two rows an update, COLUMNS=20 about ten).
TEST(LiveViewTest, OnATerminalTheLineFitsItsWidth) {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0) GTEST_SKIP() << "no pseudo-terminal here";
  ASSERT_EQ(::grantpt(master), 0);
  ASSERT_EQ(::unlockpt(master), 0);
  const int slave = ::open(::ptsname(master), O_RDWR | O_NOCTTY);
  ASSERT_GE(slave, 0);
  struct winsize size {};
  size.ws_col = 40;
  size.ws_row = 24;
  ASSERT_EQ(::ioctl(slave, TIOCSWINSZ, &size), 0);
  std::FILE* out = ::fdopen(slave, "w");
  ASSERT_NE(out, nullptr);
  {
    LiveView view(out);
    TimelinePoint p{.t_s = 1.0, .samples_per_s = 1234, .stall_fraction = 0.1, .workers = 3};
    view.Update(p, "epoch 1 37 %", "model: 3 workers because of a long reason text");
    view.Finish();
  }
  std::fclose(out);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(master, buf, sizeof buf)) > 0;) {
    got.append(buf, static_cast<size_t>(n));
    if (got.find('\n') != std::string::npos) break;
  }
  ::close(master);
  const size_t start = got.find("\033[K");
  ASSERT_NE(start, std::string::npos) << got;
  const std::string row = got.substr(start + 3, got.find_first_of("\r\n", start + 3) - start - 3);
  EXPECT_EQ(row.size(), 39u) << row;  // one short of the last column
  EXPECT_EQ(row.rfind("   1.0s epoch 1 37 %", 0), 0u) << row;
}

TEST(LiveViewTest, NodeTextShowsTheShareAndTheNodesTotals) {
  NodeView v;
  EXPECT_EQ(NodeViewText(v), "no node registry");
  v.registry = "/tmp/stoker-node-0";
  v.share_cores = 1.5;
  v.budget_cores = 4;
  v.loaders = 3;
  v.workers = 7;
  EXPECT_EQ(NodeViewText(v), "share 1.5/4.0 cores, node: 3 loaders, 7 workers");
}

}  // namespace
}  // namespace stoker

namespace stoker {
namespace {

TEST(LiveViewTest, GpuColumnsShowWhatNvmlGave) {
  GpuUsage full{.index = 0,
                .utilization_percent = 37,
                .memory_used_bytes = int64_t{3} << 29,
                .memory_total_bytes = int64_t{8} << 30,
                .pcie_rx_bytes_per_s = 120e6,
                .pcie_tx_bytes_per_s = 3e6};
  GpuUsage bare{.index = 1};
  EXPECT_EQ(GpuColumns({full, bare}), "GPU0  37% 1.5/8.0GiB PCIe rx 120 tx 3 MB/s  GPU1");
  EXPECT_EQ(GpuColumns({}), "");
}

TEST(LiveViewTest, TunerDecisionsRecordTheGpus) {
  TunerDecision d;
  d.gpus = {GpuUsage{.index = 2, .utilization_percent = 64}};
  const auto j = TunerDecisionToJson(d);
  ASSERT_EQ(j["gpus"].size(), 1u);
  EXPECT_EQ(j["gpus"][0]["index"], 2);
  EXPECT_EQ(j["gpus"][0]["utilization_percent"], 64);
}

}  // namespace
// `stoker monitor`'s view: a fixed count shows "fixed" and null shares in
// JSON; a data-bound need is null, not inf; the command loses its folder
// and control bytes, and is cut to the terminal's width.
TEST(NodeLoadersTest, TableAndJsonShowEachLoader) {
  NodeLoaders node;
  node.registries = {"/dev/shm/stoker-0/node-v3"};
  NodeLoaderInfo tuned;
  tuned.pid = 4242;
  tuned.local_rank = 1;
  tuned.workers = 6;
  tuned.prefetch_batches = 4;
  tuned.samples_per_s = 1500;
  tuned.stall = 0.25;
  tuned.cpu_cores = 3.5;
  tuned.want_cores = std::numeric_limits<double>::infinity();
  tuned.share_cores = 4;
  tuned.budget_cores = 8;
  tuned.command = "/usr/bin/python3 train.py --epochs 90";
  NodeLoaderInfo fixed = tuned;
  fixed.pid = 4343;
  fixed.tuned = false;
  fixed.workers = 2;
  fixed.command = "python3 \x1b]0;title";
  node.loaders = {tuned, fixed};
  const std::string text = FormatNodeLoaders(node, 0);
  EXPECT_NE(text.find("python3 train.py --epochs 90"), std::string::npos) << text;
  EXPECT_EQ(text.find("/usr/bin"), std::string::npos) << text;
  EXPECT_NE(text.find("4.0/8.0"), std::string::npos) << text;
  EXPECT_NE(text.find("fixed"), std::string::npos) << text;
  EXPECT_NE(text.find("25%"), std::string::npos) << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_NE(text.find("2 loaders (node registry /dev/shm/stoker-0/node-v3)"), std::string::npos);
  std::istringstream lines(FormatNodeLoaders(node, 80));
  for (std::string line; std::getline(lines, line);) {
    if (line.find("node registry") == std::string::npos) {
      EXPECT_LE(line.size(), 80u) << line;
    }
  }
  const nlohmann::json j = NodeLoadersToJson(node);
  EXPECT_EQ(j["loaders"][0]["local_rank"], 1);
  EXPECT_TRUE(j["loaders"][0]["want_cores"].is_null());
  EXPECT_EQ(j["loaders"][0]["share_cores"], 4.0);
  EXPECT_EQ(j["loaders"][1]["tuned"], false);
  EXPECT_TRUE(j["loaders"][1]["share_cores"].is_null());
  EXPECT_EQ(j["loaders"][0]["command"], tuned.command);
  EXPECT_NE(FormatNodeLoaders(NodeLoaders{}, 80).find("no stoker loader"), std::string::npos);
}

}  // namespace stoker
