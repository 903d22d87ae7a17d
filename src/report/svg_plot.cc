#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "stoker/json_text.h"
#include "stoker/report.h"

namespace stoker {
namespace {

// One panel's frame: maps data coordinates to pixels inside a box.
struct Frame {
  double x0, y0, w, h;            // box in pixels
  double xmin, xmax, ymin, ymax;  // data range
  double X(double x) const { return x0 + (x - xmin) / std::max(xmax - xmin, 1e-12) * w; }
  double Y(double y) const { return y0 + h - (y - ymin) / std::max(ymax - ymin, 1e-12) * h; }
};

// A tick step for about four ticks up to `top` that reads well: 1, 2, 2.5
// or 5 times a power of ten.
double NiceStep(double top) {
  const double raw = top / 4;
  const double power = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0}) {
    if (m * power >= raw * (1 - 1e-9)) return m * power;
  }
  return 10 * power;
}

// `v`, a multiple of `step`, with the decimals that tell such ticks apart
// (0.25 reads "0.25", not "0.2"); thousands as "k" from 10000.
std::string Tick(double v, double step) {
  const bool k = v >= 10000;
  if (k) {
    v /= 1000;
    step /= 1000;
  }
  int decimals = 0;
  while (decimals < 6 && std::abs(step * std::pow(10, decimals) -
                                  std::round(step * std::pow(10, decimals))) > 1e-6) {
    ++decimals;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f%s", decimals, v, k ? "k" : "");
  return buf;
}

std::string Num(double v) {
  char buf[32];
  if (v >= 10000) {
    std::snprintf(buf, sizeof buf, "%.0fk", v / 1000);
  } else if (v >= 100 || v == static_cast<int>(v)) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f", v);
  }
  return buf;
}

// `whole_x`: the x axis counts things (workers): ticks at whole numbers only.
void Axes(std::ostringstream& s, const Frame& f, const std::string& xlabel,
          const std::string& ylabel, bool whole_x, const std::string& color = "#333") {
  s << "<rect x='" << f.x0 << "' y='" << f.y0 << "' width='" << f.w << "' height='" << f.h
    << "' fill='none' stroke='#999'/>\n";
  std::vector<double> xticks;
  if (whole_x) {
    const double step = std::max(1.0, std::ceil((f.xmax - f.xmin) / 4));
    for (double x = std::ceil(f.xmin); x <= f.xmax + 1e-9; x += step) xticks.push_back(x);
  } else {
    for (int i = 0; i <= 4; ++i) xticks.push_back(f.xmin + (f.xmax - f.xmin) * i / 4);
  }
  const double ystep = (f.ymax - f.ymin) / 4;
  for (int i = 0; i <= 4; ++i) {
    double yv = f.ymin + ystep * i;
    s << "<line x1='" << f.x0 << "' x2='" << f.x0 + f.w << "' y1='" << f.Y(yv) << "' y2='"
      << f.Y(yv) << "' stroke='#eee'/>\n";
    s << "<text x='" << f.x0 - 6 << "' y='" << f.Y(yv) + 4
      << "' text-anchor='end' font-size='11' fill='" << color << "'>" << Tick(yv, ystep)
      << "</text>\n";
  }
  for (double xv : xticks) {
    s << "<text x='" << f.X(xv) << "' y='" << f.y0 + f.h + 16
      << "' text-anchor='middle' font-size='11'>" << Num(xv) << "</text>\n";
  }
  s << "<text x='" << f.x0 + f.w / 2 << "' y='" << f.y0 + f.h + 34
    << "' text-anchor='middle' font-size='12'>" << xlabel << "</text>\n";
  s << "<text x='" << f.x0 - 48 << "' y='" << f.y0 + f.h / 2 << "' font-size='12' fill='" << color
    << "' transform='rotate(-90 " << f.x0 - 48 << " " << f.y0 + f.h / 2
    << ")' text-anchor='middle'>" << ylabel << "</text>\n";
}

void Polyline(std::ostringstream& s, const std::vector<std::pair<double, double>>& pts,
              const Frame& f, const std::string& color, bool dots) {
  s << "<polyline fill='none' stroke='" << color << "' stroke-width='2' points='";
  for (auto& [x, y] : pts) s << f.X(x) << "," << f.Y(y) << " ";
  s << "'/>\n";
  if (dots) {
    for (auto& [x, y] : pts) {
      s << "<circle cx='" << f.X(x) << "' cy='" << f.Y(y) << "' r='3' fill='" << color << "'/>\n";
    }
  }
}

}  // namespace

std::string SweepToSvg(const SweepReport& r, const std::string& title) {
  // A sweep of static counts alone (stoker.bench over a torch DataLoader)
  // has no tuned run: the left panel only.
  const bool tuned_panel = r.tuned_measured || !r.tuned_timeline.empty();
  const double width = tuned_panel ? 900 : 440, height = 380;
  std::ostringstream s;
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width << "' height='" << height
    << "' font-family='sans-serif'>\n<rect width='100%' height='100%' fill='white'/>\n";
  s << "<text x='" << width / 2 << "' y='22' text-anchor='middle' font-size='15'>" << XmlText(title)
    << "</text>\n";

  // Every point drawn lies inside the frame.
  double top = r.best_static.samples_per_s;
  for (auto& p : r.sweep) top = std::max(top, p.samples_per_s);
  for (auto& p : r.tuned_timeline) top = std::max(top, p.samples_per_s);
  // Up to four round ticks (a rate under one sample a second keeps its own scale).
  top = top > 0 ? 4 * NiceStep(top * 1.1) : 1.0;

  // Left: the sweep.
  int wmax = 1;
  for (auto& p : r.sweep) wmax = std::max(wmax, p.workers);
  Frame left{70, 45, 330, 270, 0, static_cast<double>(wmax), 0, top};
  Axes(s, left, "workers", "samples/s", /*whole_x=*/true);
  std::vector<std::pair<double, double>> sweep;
  for (auto& p : r.sweep) sweep.emplace_back(p.workers, p.samples_per_s);
  Polyline(s, sweep, left, "#1f77b4", true);
  // The count the table marks best, ringed on its own point.
  for (auto& p : r.sweep) {
    if (p.workers != r.recommended.workers) continue;
    s << "<circle cx='" << left.X(p.workers) << "' cy='" << left.Y(p.samples_per_s)
      << "' r='6' fill='none' stroke='#d62728'/>\n";
  }
  s << "<text x='" << left.x0 + 8 << "' y='" << left.y0 + 16
    << "' font-size='12'>static sweep (best circled)</text>\n";

  // Right: the tuned run over time; workers on a second axis.
  if (!tuned_panel) {
    s << "</svg>\n";
    return s.str();
  }
  double tmax = r.tuned_timeline.empty() ? 1 : r.tuned_timeline.back().t_s;
  int tw = 1;
  for (auto& p : r.tuned_timeline) tw = std::max(tw, p.workers);
  Frame right{520, 45, 320, 270, 0, tmax, 0, top};
  Frame right_w{520, 45, 320, 270, 0, tmax, 0, static_cast<double>(tw + 1)};
  Axes(s, right, "seconds", "samples/s", /*whole_x=*/false);
  const int wstep = std::max(1, (tw + 1 + 3) / 4);  // whole worker counts only
  for (int v = 0; v <= tw + 1; v += wstep) {
    s << "<text x='" << right.x0 + right.w + 6 << "' y='" << right_w.Y(v) + 4
      << "' font-size='11' fill='#2ca02c'>" << v << "</text>\n";
  }
  s << "<line x1='" << right.x0 << "' x2='" << right.x0 + right.w << "' y1='"
    << right.Y(r.best_static.samples_per_s) << "' y2='" << right.Y(r.best_static.samples_per_s)
    << "' stroke='#d62728' stroke-dasharray='5,4'/>\n";
  std::vector<std::pair<double, double>> rate, workers;
  for (auto& p : r.tuned_timeline) {
    rate.emplace_back(p.t_s, p.samples_per_s);
    workers.emplace_back(p.t_s, p.workers);
  }
  Polyline(s, rate, right, "#1f77b4", false);
  Polyline(s, workers, right_w, "#2ca02c", false);
  s << "<text x='" << right.x0 + 8 << "' y='" << right.y0 + 16
    << "' font-size='12'>tuned: samples/s (blue), workers (green, right axis), best static "
       "(red)</text>\n";
  s << "</svg>\n";
  return s.str();
}

}  // namespace stoker
