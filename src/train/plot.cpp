// The loss-curve PNG (plot.h): a palette image, lines by Bresenham, a 3x5 font for numbers and
// the axis names, and a PNG writer with stored deflate blocks, CRC-32 and Adler-32 computed here.
// Trainer layer (host code).
#include "sciattn/train/plot.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace sciattn::train {
namespace {

// Palette indices.
enum Color : uint8_t { kWhite = 0, kBlack = 1, kGrid = 2, kLine = 3 };
constexpr uint8_t kPalette[4][3] = {{255, 255, 255}, {0, 0, 0}, {225, 225, 225}, {31, 90, 180}};

// Plot area inside the image.
constexpr int kLeft = 90, kRight = kPlotWidth - 30, kTop = 30, kBottom = kPlotHeight - 60;
constexpr int kFontScale = 2;

// 3x5 glyphs, one row per 3-bit number (bit 2 = left column).
struct Glyph {
  char ch;
  uint8_t rows[5];
};
constexpr Glyph kFont[] = {
    {'0', {7, 5, 5, 5, 7}}, {'1', {2, 6, 2, 2, 7}}, {'2', {7, 1, 7, 4, 7}}, {'3', {7, 1, 7, 1, 7}},
    {'4', {5, 5, 7, 1, 1}}, {'5', {7, 4, 7, 1, 7}}, {'6', {7, 4, 7, 5, 7}}, {'7', {7, 1, 1, 1, 1}},
    {'8', {7, 5, 7, 5, 7}}, {'9', {7, 5, 7, 1, 7}}, {'.', {0, 0, 0, 0, 2}}, {'-', {0, 0, 7, 0, 0}},
    {'+', {0, 2, 7, 2, 0}}, {'e', {7, 5, 7, 4, 7}}, {'l', {4, 4, 4, 4, 7}}, {'o', {0, 7, 5, 5, 7}},
    {'s', {7, 4, 7, 1, 7}}, {'t', {4, 7, 4, 4, 7}}, {'p', {7, 5, 7, 4, 4}},
};

class Canvas {
 public:
  Canvas() : pixels_(static_cast<size_t>(kPlotWidth) * kPlotHeight, kWhite) {}
  void set(int x, int y, uint8_t c) {
    if (x >= 0 && x < kPlotWidth && y >= 0 && y < kPlotHeight) {
      pixels_[static_cast<size_t>(y) * kPlotWidth + x] = c;
    }
  }
  void line(int x0, int y0, int x1, int y1, uint8_t c) {
    const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
    const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    while (true) {
      set(x0, y0, c);
      if (x0 == x1 && y0 == y1) break;
      const int e2 = 2 * err;
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
  // Text with its top-left corner at (x, y); unknown characters are blanks.
  void text(int x, int y, const std::string& s, uint8_t c) {
    for (char ch : s) {
      for (const Glyph& g : kFont) {
        if (g.ch != ch) continue;
        for (int r = 0; r < 5; ++r) {
          for (int col = 0; col < 3; ++col) {
            if ((g.rows[r] >> (2 - col)) & 1) {
              for (int a = 0; a < kFontScale; ++a) {
                for (int b = 0; b < kFontScale; ++b) {
                  set(x + col * kFontScale + a, y + r * kFontScale + b, c);
                }
              }
            }
          }
        }
      }
      x += 4 * kFontScale;
    }
  }
  static int text_width(const std::string& s) {
    return static_cast<int>(s.size()) * 4 * kFontScale;
  }
  std::vector<uint8_t> take() { return std::move(pixels_); }

 private:
  std::vector<uint8_t> pixels_;
};

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc = 0) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

void put_be32(std::vector<uint8_t>* out, uint32_t v) {
  for (int i = 3; i >= 0; --i) out->push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void chunk(std::vector<uint8_t>* png, const char type[4], const std::vector<uint8_t>& data) {
  put_be32(png, static_cast<uint32_t>(data.size()));
  const size_t start = png->size();
  png->insert(png->end(), type, type + 4);
  png->insert(png->end(), data.begin(), data.end());
  put_be32(png, crc32(png->data() + start, png->size() - start));
}

}  // namespace

std::vector<uint8_t> render_loss_plot(const std::vector<double>& steps,
                                      const std::vector<double>& losses) {
  Canvas canvas;
  std::vector<std::pair<double, double>> points;
  for (size_t i = 0; i < steps.size() && i < losses.size(); ++i) {
    if (std::isfinite(losses[i]) && std::isfinite(steps[i]))
      points.push_back({steps[i], losses[i]});
  }
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  if (!points.empty()) {
    x0 = x1 = points[0].first;
    y0 = y1 = points[0].second;
    for (const auto& [x, y] : points) {
      x0 = std::min(x0, x);
      x1 = std::max(x1, x);
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
  }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  auto px = [&](double x) {
    return kLeft + static_cast<int>(std::lround((x - x0) / (x1 - x0) * (kRight - kLeft)));
  };
  auto py = [&](double y) {
    return kBottom - static_cast<int>(std::lround((y - y0) / (y1 - y0) * (kBottom - kTop)));
  };
  // Grid: quarters of each axis.
  for (int k = 1; k < 4; ++k) {
    const int gx = kLeft + k * (kRight - kLeft) / 4, gy = kTop + k * (kBottom - kTop) / 4;
    canvas.line(gx, kTop, gx, kBottom, kGrid);
    canvas.line(kLeft, gy, kRight, gy, kGrid);
  }
  canvas.line(kLeft, kBottom, kRight, kBottom, kBlack);
  canvas.line(kLeft, kTop, kLeft, kBottom, kBlack);
  for (size_t i = 1; i < points.size(); ++i) {
    canvas.line(px(points[i - 1].first), py(points[i - 1].second), px(points[i].first),
                py(points[i].second), kLine);
  }
  if (points.size() == 1) canvas.set(px(points[0].first), py(points[0].second), kLine);
  // Labels: the axes' extremes, and their names.
  const std::string ymax = number(y1), ymin = number(y0), xmin = number(x0), xmax = number(x1);
  canvas.text(kLeft - 8 - Canvas::text_width(ymax), kTop - 5, ymax, kBlack);
  canvas.text(kLeft - 8 - Canvas::text_width(ymin), kBottom - 5, ymin, kBlack);
  canvas.text(kLeft - 4, kBottom + 10, xmin, kBlack);
  canvas.text(kRight - Canvas::text_width(xmax) + 4, kBottom + 10, xmax, kBlack);
  canvas.text((kLeft + kRight) / 2 - Canvas::text_width("step") / 2, kBottom + 32, "step", kBlack);
  canvas.text(12, (kTop + kBottom) / 2 - 5, "loss", kBlack);
  return canvas.take();
}

std::vector<uint8_t> encode_png(const std::vector<uint8_t>& indices, int width, int height) {
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<uint8_t> ihdr;
  put_be32(&ihdr, static_cast<uint32_t>(width));
  put_be32(&ihdr, static_cast<uint32_t>(height));
  ihdr.insert(ihdr.end(), {8, 3, 0, 0, 0});  // 8-bit palette indices, no interlace
  chunk(&png, "IHDR", ihdr);
  std::vector<uint8_t> plte;
  for (const auto& c : kPalette) plte.insert(plte.end(), c, c + 3);
  chunk(&png, "PLTE", plte);
  // Scanlines, each with filter type 0, in stored deflate blocks of at most 65535 bytes.
  std::vector<uint8_t> raw;
  raw.reserve(static_cast<size_t>(height) * (width + 1));
  for (int y = 0; y < height; ++y) {
    raw.push_back(0);
    raw.insert(raw.end(), indices.begin() + static_cast<std::ptrdiff_t>(y) * width,
               indices.begin() + static_cast<std::ptrdiff_t>(y + 1) * width);
  }
  std::vector<uint8_t> z = {0x78, 0x01};  // zlib header: deflate, 32K window, no dictionary
  size_t pos = 0;
  do {
    const size_t n = std::min<size_t>(65535, raw.size() - pos);
    const bool last = pos + n == raw.size();
    z.push_back(last ? 1 : 0);
    z.push_back(static_cast<uint8_t>(n & 0xFF));
    z.push_back(static_cast<uint8_t>(n >> 8));
    z.push_back(static_cast<uint8_t>(~n & 0xFF));
    z.push_back(static_cast<uint8_t>((~n >> 8) & 0xFF));
    z.insert(z.end(), raw.begin() + static_cast<std::ptrdiff_t>(pos),
             raw.begin() + static_cast<std::ptrdiff_t>(pos + n));
    pos += n;
  } while (pos < raw.size());
  uint32_t a = 1, b = 0;  // Adler-32 of the uncompressed data
  for (uint8_t v : raw) {
    a = (a + v) % 65521;
    b = (b + a) % 65521;
  }
  put_be32(&z, (b << 16) | a);
  chunk(&png, "IDAT", z);
  chunk(&png, "IEND", {});
  return png;
}

Status write_loss_plot(const std::string& path, const std::vector<double>& steps,
                       const std::vector<double>& losses) {
  bool any = false;
  for (double l : losses) any = any || std::isfinite(l);
  if (!any) return Status::invalid_argument("loss plot: no finite loss to draw");
  const std::vector<uint8_t> png =
      encode_png(render_loss_plot(steps, losses), kPlotWidth, kPlotHeight);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  out.flush();
  if (!out)
    return Status::invalid_argument("cannot write \"" + path + "\": " + std::strerror(errno));
  return Status::ok_status();
}

}  // namespace sciattn::train
