// PNG writing and drawing for benchmark charts (see png_chart.h).
#include "tests/bench/png_chart.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>

namespace hr::bench {

namespace {

void put_be32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((v >> shift) & 0xff));
}

// One PNG chunk: length, type, data, CRC-32 of type and data.
void put_chunk(std::string& out, const char* type, const std::string& data) {
  put_be32(out, static_cast<uint32_t>(data.size()));
  std::string body = std::string(type, 4) + data;
  out += body;
  put_be32(out, crc32(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
}

// 5x7 glyphs: seven rows, bit 4 the leftmost column.
struct Glyph {
  char c;
  std::array<uint8_t, 7> rows;
};
constexpr Glyph kFont[] = {
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}},
    {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}},
    {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}},
    {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}},
    {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}},
    {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'A', {0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11}},
    {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}},
    {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}},
    {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}},
    {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}},
    {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}},
    {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
    {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}},
    {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}},
    {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
    {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}},
    {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}},
    {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
    {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}},
    {',', {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08}},
    {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
    {'+', {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}},
    {'/', {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}},
    {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}},
    {'=', {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}},
    {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}},
    {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}},
    {'@', {0x0E, 0x11, 0x01, 0x0D, 0x15, 0x15, 0x0E}},
    {'?', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x00, 0x04}},
    {' ', {0, 0, 0, 0, 0, 0, 0}},
};

const std::array<uint8_t, 7>& glyph(char c) {
  if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  for (const Glyph& g : kFont) {
    if (g.c == c) return g.rows;
  }
  return glyph('?');
}

constexpr int kAdvance = 6;  // glyph width plus one column of space

}  // namespace

uint32_t crc32(const uint8_t* data, size_t size, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ data[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t adler32(const uint8_t* data, size_t size) {
  uint32_t a = 1, b = 0;
  for (size_t i = 0; i < size; ++i) {
    a = (a + data[i]) % 65521;
    b = (b + a) % 65521;
  }
  return (b << 16) | a;
}

std::string encode_png(int width, int height, const std::vector<uint8_t>& rgb) {
  // Scanlines, each behind filter byte 0 (none).
  std::vector<uint8_t> raw;
  const size_t row = static_cast<size_t>(width) * 3;
  raw.reserve((row + 1) * static_cast<size_t>(height));
  for (int y = 0; y < height; ++y) {
    raw.push_back(0);
    const uint8_t* p = rgb.data() + row * static_cast<size_t>(y);
    raw.insert(raw.end(), p, p + row);
  }
  // zlib: header (deflate, 32 KiB window, no dictionary, fastest), stored blocks of at most
  // 65,535 bytes (BFINAL on the last, BTYPE 00, LEN and its complement, little-endian), Adler-32.
  std::string z = {0x78, 0x01};
  size_t off = 0;
  do {
    size_t n = std::min<size_t>(65535, raw.size() - off);
    bool last = off + n == raw.size();
    z.push_back(static_cast<char>(last ? 1 : 0));
    uint16_t len = static_cast<uint16_t>(n), nlen = static_cast<uint16_t>(~len);
    z.push_back(static_cast<char>(len & 0xff));
    z.push_back(static_cast<char>(len >> 8));
    z.push_back(static_cast<char>(nlen & 0xff));
    z.push_back(static_cast<char>(nlen >> 8));
    z.append(reinterpret_cast<const char*>(raw.data()) + off, n);
    off += n;
  } while (off < raw.size());
  put_be32(z, adler32(raw.data(), raw.size()));

  std::string ihdr;
  put_be32(ihdr, static_cast<uint32_t>(width));
  put_be32(ihdr, static_cast<uint32_t>(height));
  ihdr += std::string{8, 2, 0, 0, 0};  // 8 bits, RGB, deflate, adaptive filtering, no interlace
  std::string out = "\x89PNG\r\n\x1a\n";
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", z);
  put_chunk(out, "IEND", "");
  return out;
}

Canvas::Canvas(int width, int height, Rgb background)
    : width_(width), height_(height), pixels_(static_cast<size_t>(width) * height * 3) {
  fill(0, 0, width, height, background);
}

void Canvas::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  uint8_t* p = &pixels_[(static_cast<size_t>(y) * width_ + x) * 3];
  p[0] = c.r;
  p[1] = c.g;
  p[2] = c.b;
}

void Canvas::line(int x0, int y0, int x1, int y1, Rgb c) {
  int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  for (;;) {
    set(x0, y0, c);
    if (x0 == x1 && y0 == y1) return;
    int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}

void Canvas::dashed_vline(int x, int y0, int y1, Rgb c, int dash) {
  for (int y = std::min(y0, y1); y <= std::max(y0, y1); ++y) {
    if ((y / dash) % 2 == 0) set(x, y, c);
  }
}

void Canvas::fill(int x, int y, int w, int h, Rgb c) {
  for (int j = y; j < y + h; ++j) {
    for (int i = x; i < x + w; ++i) set(i, j, c);
  }
}

void Canvas::dot(int x, int y, int radius, Rgb c) {
  for (int j = -radius; j <= radius; ++j) {
    for (int i = -radius; i <= radius; ++i) {
      if (i * i + j * j <= radius * radius + radius) set(x + i, y + j, c);
    }
  }
}

void Canvas::text(int x, int y, std::string_view s, Rgb c, int scale) {
  for (char ch : s) {
    const auto& rows = glyph(ch);
    for (int r = 0; r < 7; ++r) {
      for (int col = 0; col < 5; ++col) {
        if (rows[r] & (0x10 >> col)) fill(x + col * scale, y + r * scale, scale, scale, c);
      }
    }
    x += kAdvance * scale;
  }
}

int Canvas::text_width(std::string_view s, int scale) {
  return s.empty() ? 0 : (static_cast<int>(s.size()) * kAdvance - 1) * scale;
}

void Canvas::text_up(int x, int y, std::string_view s, Rgb c, int scale) {
  int len = text_width(s, scale);
  int pos = 0;  // along the baseline, from the bottom
  for (char ch : s) {
    const auto& rows = glyph(ch);
    for (int r = 0; r < 7; ++r) {
      for (int col = 0; col < 5; ++col) {
        if (!(rows[r] & (0x10 >> col))) continue;
        // Glyph (col, r) → canvas (r, len - pos - col): rows run left to right, columns upwards.
        fill(x + r * scale, y + len - pos - (col + 1) * scale, scale, scale, c);
      }
    }
    pos += kAdvance * scale;
  }
}

bool Canvas::write_png(const std::string& path) const {
  std::ofstream out(path, std::ios::binary);
  std::string bytes = png();
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

double nice_step(double max, int target) {
  if (!(max > 0)) return 1;
  double raw = max / target;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double f = raw / mag;
  double nice = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  return nice * mag;
}

double nice_ceil(double v, int target) {
  if (!(v > 0)) return 1;
  double step = nice_step(v, target);
  return std::ceil(v / step - 1e-9) * step;
}

std::string tick_label(double v) {
  char buf[32];
  if (std::fabs(v - std::round(v)) < 1e-9) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.2g", v);
  }
  return buf;
}

Panel::Panel(Canvas& canvas, int left, int top, int width, int height, double x_max, double y_max)
    : canvas_(canvas),
      left_(left),
      top_(top),
      width_(width),
      height_(height),
      x_max_(x_max > 0 ? x_max : 1),
      y_max_(y_max > 0 ? y_max : 1) {}

int Panel::px(double x) const {
  return left_ + static_cast<int>(std::lround(x / x_max_ * (width_ - 1)));
}

int Panel::py(double y) const {
  double f = std::clamp(y / y_max_, 0.0, 1.0);
  return top_ + height_ - 1 - static_cast<int>(std::lround(f * (height_ - 1)));
}

void Panel::axes(std::string_view x_title, std::string_view y_title, Rgb ink, Rgb grid) {
  double ys = nice_step(y_max_, 5);
  for (double v = 0; v <= y_max_ * (1 + 1e-9); v += ys) {
    int y = py(v);
    if (v > 0) canvas_.line(left_ + 1, y, left_ + width_ - 2, y, grid);
    canvas_.line(left_ - 5, y, left_, y, ink);
    std::string s = tick_label(v);
    canvas_.text(left_ - 8 - Canvas::text_width(s), y - 3, s, ink);
  }
  double xs = nice_step(x_max_, 12);
  for (double v = 0; v <= x_max_ * (1 + 1e-9); v += xs) {
    int x = px(v);
    canvas_.line(x, top_ + height_, x, top_ + height_ + 4, ink);
    std::string s = tick_label(v);
    canvas_.text(x - Canvas::text_width(s) / 2, top_ + height_ + 8, s, ink);
  }
  canvas_.line(left_, top_, left_ + width_ - 1, top_, ink);
  canvas_.line(left_, top_ + height_ - 1, left_ + width_ - 1, top_ + height_ - 1, ink);
  canvas_.line(left_, top_, left_, top_ + height_ - 1, ink);
  canvas_.line(left_ + width_ - 1, top_, left_ + width_ - 1, top_ + height_ - 1, ink);
  canvas_.text(left_ + width_ - Canvas::text_width(x_title), top_ + height_ + 20, x_title, ink);
  canvas_.text_up(left_ - 58, top_ + (height_ - Canvas::text_width(y_title)) / 2, y_title, ink);
}

void Panel::vline(double x, Rgb c, bool dashed) {
  if (dashed) {
    canvas_.dashed_vline(px(x), top_ + 1, top_ + height_ - 2, c);
  } else {
    canvas_.line(px(x), top_ + 1, px(x), top_ + height_ - 2, c);
  }
}

void Panel::shade(double x0, double x1, Rgb c) {
  int a = std::max(left_ + 1, px(x0)), b = std::min(left_ + width_ - 2, px(x1));
  canvas_.fill(a, top_ + 1, b - a + 1, height_ - 2, c);
}

void Panel::dot(double x, double y, int radius, Rgb c) { canvas_.dot(px(x), py(y), radius, c); }

void Panel::polyline(const std::vector<double>& xs, const std::vector<double>& ys, Rgb c,
                     int thickness) {
  for (size_t i = 1; i < xs.size() && i < ys.size(); ++i) {
    if (std::isnan(ys[i - 1]) || std::isnan(ys[i])) continue;
    for (int t = 0; t < thickness; ++t) {
      canvas_.line(px(xs[i - 1]), py(ys[i - 1]) - t, px(xs[i]), py(ys[i]) - t, c);
    }
  }
}

void Panel::steps(const std::vector<double>& x0s, const std::vector<double>& x1s,
                  const std::vector<double>& ys, Rgb c) {
  int prev_x = -1, prev_y = -1;
  for (size_t i = 0; i < x0s.size() && i < x1s.size() && i < ys.size(); ++i) {
    int a = px(x0s[i]), b = px(x1s[i]), y = py(ys[i]);
    if (prev_x == a) canvas_.line(a, prev_y, a, y, c);  // rise or fall between touching steps
    canvas_.line(a, y, b, y, c);
    canvas_.line(a, y - 1, b, y - 1, c);
    prev_x = b;
    prev_y = y;
  }
}

void Panel::label(double x, std::string_view s, Rgb c, int scale) {
  canvas_.text(px(x) + 4, top_ + 5, s, c, scale);
}

}  // namespace hr::bench
