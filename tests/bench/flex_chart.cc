// The flex benchmark's chart (see flex_chart.h).
#include "tests/bench/flex_chart.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace hr::bench {

namespace {

constexpr Rgb kWhite{255, 255, 255};
constexpr Rgb kInk{40, 40, 40};
constexpr Rgb kGrid{228, 228, 228};
constexpr Rgb kShade{243, 243, 232};
constexpr Rgb kPhaseLine{150, 150, 150};
constexpr Rgb kSyncOnly{30, 150, 80};   // phase a dots
constexpr Rgb kSyncAsync{215, 90, 30};  // phase b dots
constexpr Rgb kP99{20, 20, 120};
constexpr Rgb kAsync{40, 90, 210};
constexpr Rgb kSync{230, 140, 20};
constexpr Rgb kCapacity{120, 120, 120};
constexpr Rgb kFailed{200, 0, 0};

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// The phase a send time falls in (by its first letter), or 0.
char phase_of(double t, const std::vector<PhaseMark>& phases) {
  char letter = 0;
  for (const PhaseMark& m : phases) {
    if (t >= m.start_s && !m.name.empty()) letter = m.name[0];
  }
  return letter;
}

// Each phase: its measurement window shaded, a line at its start, a dashed one at its end, and
// its name (or only its letter where the name does not fit before the next phase).
void mark_phases(Panel& p, const std::vector<PhaseMark>& phases, bool names) {
  for (size_t i = 0; i < phases.size(); ++i) {
    const PhaseMark& m = phases[i];
    p.shade(m.window_start_s, m.window_end_s, kShade);
    p.vline(m.start_s, kPhaseLine, false);
    p.vline(m.window_end_s, kPhaseLine, true);
    int room = (i + 1 < phases.size() ? p.px(phases[i + 1].start_s) : p.left() + p.width()) -
               p.px(m.start_s) - 10;
    bool fits = Canvas::text_width(m.name, 2) <= room;
    p.label(m.start_s, names && fits ? m.name : m.name.substr(0, 1), kInk, 2);
  }
}

// A legend entry: a colour swatch and its text, drawn right to left from `*right`.
void legend(Canvas& c, int* right, int y, Rgb color, const std::string& text) {
  int w = Canvas::text_width(text);
  *right -= w;
  c.text(*right, y, text, kInk);
  *right -= 14;
  c.fill(*right, y, 9, 7, color);
  *right -= 16;
}

}  // namespace

bool write_flex_chart(const std::string& path, const std::string& title,
                      const std::vector<Sample>& samples, const std::vector<SyncPoint>& points,
                      const std::vector<PhaseMark>& phases, double capacity_tokens_per_s) {
  const int kWidth = 1200, kHeight = 800, kLeft = 90, kPlotWidth = 1080;
  Canvas canvas(kWidth, kHeight, kWhite);
  canvas.text(kLeft, 14, title, kInk, 2);

  double t_end = 1;
  for (const Sample& s : samples) t_end = std::max(t_end, s.t);
  for (const SyncPoint& p : points) t_end = std::max(t_end, p.sent_s);
  const double x_max = nice_ceil(t_end, 12);

  // Top: time to first token of each sync request.
  std::vector<double> ttfts;
  for (const SyncPoint& p : points) {
    if (p.ttft_ms >= 0) ttfts.push_back(p.ttft_ms);
  }
  double y_top = 1;
  if (!ttfts.empty()) {
    double max = *std::max_element(ttfts.begin(), ttfts.end());
    y_top = nice_ceil(1.1 * std::min(max, 3 * percentile(ttfts, 0.99)));  // outliers sit on top
  }
  Panel top(canvas, kLeft, 60, kPlotWidth, 300, x_max, y_top);
  mark_phases(top, phases, true);
  top.axes("S", "SYNC TTFT (MS)", kInk, kGrid);
  for (const SyncPoint& p : points) {
    if (p.ttft_ms < 0) {
      top.dot(p.sent_s, y_top, 3, kFailed);
      continue;
    }
    top.dot(p.sent_s, p.ttft_ms, 2, phase_of(p.sent_s, phases) == 'B' ? kSyncAsync : kSyncOnly);
  }
  std::map<int, std::vector<double>> per_second;
  for (const SyncPoint& p : points) {
    if (p.ttft_ms >= 0) per_second[static_cast<int>(std::floor(p.sent_s))].push_back(p.ttft_ms);
  }
  std::vector<double> xs, ys;
  int prev = std::numeric_limits<int>::min();
  for (const auto& [second, v] : per_second) {
    if (second != prev + 1 && !xs.empty()) {  // a gap: break the line
      xs.push_back(second);
      ys.push_back(std::nan(""));
    }
    xs.push_back(second + 0.5);
    ys.push_back(percentile(v, 0.99));
    prev = second;
  }
  top.polyline(xs, ys, kP99, 2);
  int right = kLeft + kPlotWidth;
  legend(canvas, &right, 46, kP99, "P99 PER 1 S");
  legend(canvas, &right, 46, kSyncAsync, "TTFT (B)");
  legend(canvas, &right, 46, kSyncOnly, "TTFT (A)");

  // Bottom: generated tokens/s per sampling interval, by class.
  std::vector<double> x0s, x1s, async_rate, sync_rate;
  double y_max = capacity_tokens_per_s;
  for (size_t i = 1; i < samples.size(); ++i) {
    double dt = samples[i].t - samples[i - 1].t;
    if (dt <= 0) continue;
    x0s.push_back(samples[i - 1].t);
    x1s.push_back(samples[i].t);
    async_rate.push_back((samples[i].async_tokens - samples[i - 1].async_tokens) / dt);
    sync_rate.push_back((samples[i].sync_tokens - samples[i - 1].sync_tokens) / dt);
    y_max = std::max({y_max, async_rate.back(), sync_rate.back()});
  }
  Panel bottom(canvas, kLeft, 440, kPlotWidth, 300, x_max, nice_ceil(1.05 * y_max));
  mark_phases(bottom, phases, false);
  bottom.axes("S SINCE START", "TOKENS/S", kInk, kGrid);
  if (capacity_tokens_per_s > 0) {
    int y = bottom.py(capacity_tokens_per_s);
    for (int x = bottom.left() + 1; x < bottom.left() + bottom.width() - 1; ++x) {
      if ((x / 6) % 2 == 0) canvas.set(x, y, kCapacity);
    }
  }
  bottom.steps(x0s, x1s, sync_rate, kSync);
  bottom.steps(x0s, x1s, async_rate, kAsync);
  right = kLeft + kPlotWidth;
  legend(canvas, &right, 426, kCapacity, "CAPACITY (C)");
  legend(canvas, &right, 426, kSync, "SYNC");
  legend(canvas, &right, 426, kAsync, "ASYNC");
  return canvas.write_png(path);
}

}  // namespace hr::bench
