// The flex benchmark's chart (a PNG): sync time to first token per request over the run (top;
// dots, and the p99 of each 1-s window as a line) and generated tokens/s per metrics interval by
// class (bottom; async and sync), with each phase's start and measurement window marked.
#pragma once

#include <string>
#include <vector>

#include "tests/bench/flex_client.h"
#include "tests/bench/png_chart.h"

namespace hr::bench {

struct SyncPoint {
  double sent_s = 0;    // scheduled send time
  double ttft_ms = -1;  // < 0: the request failed
};

struct PhaseMark {
  std::string name;  // e.g. "A SYNC ONLY"; its first letter names the phase
  double start_s = 0, window_start_s = 0, window_end_s = 0;
};

// Draws and writes the chart; false when the file cannot be written.
[[nodiscard]] bool write_flex_chart(const std::string& path, const std::string& title,
                                    const std::vector<Sample>& samples,
                                    const std::vector<SyncPoint>& points,
                                    const std::vector<PhaseMark>& phases,
                                    double capacity_tokens_per_s);

}  // namespace hr::bench
