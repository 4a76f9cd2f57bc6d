// A small RGB canvas for benchmark charts, written out as PNG without zlib or libpng: 8-bit RGB,
// the zlib stream made of stored (uncompressed) deflate blocks, CRC-32 and Adler-32 computed here.
// Drawing: pixels, lines, filled rectangles, dots, text in a built-in 5x7 bitmap font (digits,
// upper-case letters, a few signs; lower case is drawn as upper case), and `Panel`, a plot area
// with axes, tick marks and tick labels. Not thread-safe; one canvas per thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hr::bench {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};

uint32_t crc32(const uint8_t* data, size_t size, uint32_t crc = 0);
uint32_t adler32(const uint8_t* data, size_t size);
// The PNG file of `rgb` (width * height * 3 bytes, rows top to bottom).
std::string encode_png(int width, int height, const std::vector<uint8_t>& rgb);

class Canvas {
 public:
  Canvas(int width, int height, Rgb background);

  int width() const { return width_; }
  int height() const { return height_; }
  void set(int x, int y, Rgb c);  // ignores points outside the canvas
  void line(int x0, int y0, int x1, int y1, Rgb c);
  void dashed_vline(int x, int y0, int y1, Rgb c, int dash = 4);
  void fill(int x, int y, int w, int h, Rgb c);
  void dot(int x, int y, int radius, Rgb c);
  // Text with its top-left corner at (x, y); each font pixel drawn as scale x scale.
  void text(int x, int y, std::string_view s, Rgb c, int scale = 1);
  static int text_width(std::string_view s, int scale = 1);
  static int text_height(int scale = 1) { return 7 * scale; }
  // Text turned a quarter counter-clockwise (reads bottom to top), its top-left corner at (x, y).
  void text_up(int x, int y, std::string_view s, Rgb c, int scale = 1);

  std::string png() const { return encode_png(width_, height_, pixels_); }
  [[nodiscard]] bool write_png(const std::string& path) const;

 private:
  int width_, height_;
  std::vector<uint8_t> pixels_;  // [height, width, 3]
};

// "Nice" tick spacing (1, 2 or 5 times a power of ten) giving about `target` ticks up to `max`.
double nice_step(double max, int target = 6);
// `v` rounded up to a multiple of nice_step(v, target).
double nice_ceil(double v, int target = 6);
// A tick label: integers without decimals, else up to two significant decimals.
std::string tick_label(double v);

// A plot area [left, left+width) x [top, top+height) mapping x in [0, x_max] and y in [0, y_max].
class Panel {
 public:
  Panel(Canvas& canvas, int left, int top, int width, int height, double x_max, double y_max);

  int px(double x) const;
  int py(double y) const;  // clamped to the panel
  // Frame, tick marks and labels on both axes, light grid lines across, and the axis titles.
  void axes(std::string_view x_title, std::string_view y_title, Rgb ink, Rgb grid);
  void vline(double x, Rgb c, bool dashed);
  void shade(double x0, double x1, Rgb c);
  void dot(double x, double y, int radius, Rgb c);
  // Consecutive points joined; NaN y values break the line.
  void polyline(const std::vector<double>& xs, const std::vector<double>& ys, Rgb c,
                int thickness = 1);
  // One flat segment per interval [x0s[i], x1s[i]] at ys[i], joined where intervals touch.
  void steps(const std::vector<double>& x0s, const std::vector<double>& x1s,
             const std::vector<double>& ys, Rgb c);
  // Text along the panel's top edge, starting just right of x.
  void label(double x, std::string_view s, Rgb c, int scale = 2);

  int left() const { return left_; }
  int top() const { return top_; }
  int width() const { return width_; }
  int height() const { return height_; }

 private:
  Canvas& canvas_;
  int left_, top_, width_, height_;
  double x_max_, y_max_;
};

}  // namespace hr::bench
