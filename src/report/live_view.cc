#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/clock.h"
#include "stoker/probe.h"
#include "stoker/report.h"

namespace stoker {
namespace {

constexpr double kPlainEveryS = 2.0;  // off a terminal, one line this often

}  // namespace

namespace {

// The length of the well-formed UTF-8 sequence at text[i] (RFC 3629: no
// overlong forms, surrogates or code points past U+10FFFF), 0 if none.
size_t Utf8Length(std::string_view text, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char lead = at(0);
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
  if (lead >= 0xc2 && lead <= 0xdf) {
    n = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    n = 3;
    if (lead == 0xe0) lo = 0xa0;
    if (lead == 0xed) hi = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    n = 4;
    if (lead == 0xf0) lo = 0x90;
    if (lead == 0xf4) hi = 0x8f;
  }
  if (n == 0 || i + n > text.size() || at(1) < lo || at(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (at(k) < 0x80 || at(k) > 0xbf) return 0;
  }
  return n;
}

// Control bytes, and bytes that are not UTF-8 (a file name's, read from a
// disk), as \xNN: a terminal shows the name as it can be typed back.
std::string Escaped(std::string_view text, bool keep_lines) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x80) {
      if (const size_t n = Utf8Length(text, i); n > 0) {
        out.append(text.substr(i, n));
        i += n;
        continue;
      }
    }
    if ((byte < 0x20 && !(keep_lines && (c == '\n' || c == '\t'))) || byte >= 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    } else {
      out += c;
    }
    ++i;
  }
  return out;
}

}  // namespace

std::string Printable(std::string_view text) { return Escaped(text, true); }

std::string PrintableLine(std::string_view text) { return Escaped(text, false); }

std::string FormatSkipped(const std::vector<SkipRecord>& skipped, int64_t count,
                          std::string_view indent) {
  constexpr size_t kNamed = 10;  // a run over many bad files would print them all
  std::string out;
  for (size_t i = 0; i < skipped.size() && i < kNamed; ++i) {
    // The epoch, as the JSON has it: a run of several epochs skips a bad file once in each.
    out.append(indent) += "epoch " + std::to_string(skipped[i].epoch) + ": " +
                          PrintableLine(skipped[i].key) + ": " + Printable(skipped[i].reason) +
                          "\n";
  }
  const int64_t named = static_cast<int64_t>(std::min(skipped.size(), kNamed));
  if (count > named) {
    out.append(indent) += "and " + std::to_string(count - named) + " more (--json lists " +
                          (count > static_cast<int64_t>(skipped.size()) ? "the first " : "") +
                          std::to_string(skipped.size()) + ")\n";
  }
  return out;
}

size_t TerminalColumns(std::FILE* out) {
  struct winsize size {};
  if (::ioctl(fileno(out), TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  const char* columns = std::getenv("COLUMNS");
  const long n = columns != nullptr ? std::strtol(columns, nullptr, 10) : 0;
  return n > 0 ? static_cast<size_t>(n) : 80;
}

LiveView::LiveView(std::FILE* out) : out_(out), tty_(isatty(fileno(out)) != 0) {
  cpu_last_s_ = ProcessCpuSeconds();
}

std::string NodeViewText(const NodeView& node) {
  if (node.loaders == 0) return "no node registry";
  char text[128];
  std::snprintf(text, sizeof text, "share %.1f/%.1f cores, node: %d loader%s, %d workers",
                node.share_cores, node.budget_cores, node.loaders, node.loaders == 1 ? "" : "s",
                node.workers);
  return text;
}

std::string GpuColumns(const std::vector<GpuUsage>& gpus) {
  std::string out;
  char col[160];
  for (const GpuUsage& g : gpus) {
    int n = std::snprintf(col, sizeof col, "%sGPU%d", out.empty() ? "" : "  ", g.index);
    if (g.utilization_percent >= 0) {
      n += std::snprintf(col + n, sizeof col - n, " %3d%%", g.utilization_percent);
    }
    if (g.memory_total_bytes > 0) {
      n += std::snprintf(col + n, sizeof col - n, " %.1f/%.1fGiB",
                         static_cast<double>(g.memory_used_bytes) / (1 << 30),
                         static_cast<double>(g.memory_total_bytes) / (1 << 30));
    }
    if (g.pcie_rx_bytes_per_s >= 0 && g.pcie_tx_bytes_per_s >= 0) {
      std::snprintf(col + n, sizeof col - n, " PCIe rx %.0f tx %.0f MB/s",
                    g.pcie_rx_bytes_per_s / 1e6, g.pcie_tx_bytes_per_s / 1e6);
    }
    out += col;
  }
  return out;
}

void LiveView::Update(const TimelinePoint& p, const std::string& progress,
                      const std::string& decision, const std::string& node,
                      const std::string& gpu) {
  if (!tty_ && p.t_s - last_print_s_ < kPlainEveryS) return;
  const double cpu = ProcessCpuSeconds();
  const double dt = p.t_s - wall_last_s_;
  const double cpu_pct = dt > 0 ? (cpu - cpu_last_s_) / dt * 100 : 0;
  cpu_last_s_ = cpu;
  wall_last_s_ = p.t_s;
  last_print_s_ = p.t_s;
  char line[512];
  std::snprintf(
      line, sizeof line,
      "%6.1fs %-16s %9.0f samples/s  stall %5.1f%%  workers %3d  CPU %4.0f%%  RSS %5zu MiB", p.t_s,
      progress.c_str(), p.samples_per_s, p.stall_fraction * 100, p.workers, cpu_pct,
      RssBytes() >> 20);
  std::string text = line;
  if (!node.empty()) text += "  " + node;
  if (!gpu.empty()) text += "  " + gpu;
  if (!decision.empty()) text += "  | " + decision;
  if (tty_) {
    // One row, short of the last column (where a terminal wraps), or each
    // redraw would leave the rows it wrapped onto behind.
    const size_t width = TerminalColumns(out_);
    if (text.size() >= width) text.resize(width > 1 ? width - 1 : 1);
    std::fprintf(out_, "\r\033[K%s", text.c_str());
  } else {
    std::fprintf(out_, "%s\n", text.c_str());
  }
  std::fflush(out_);
}

void LiveView::Finish() {
  if (tty_) std::fprintf(out_, "\n");
  std::fflush(out_);
}

}  // namespace stoker
