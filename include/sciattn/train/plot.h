// A PNG of the loss curve, drawn by a small rasteriser with a built-in digit font and written
// as an uncompressed (stored-block) zlib stream, so it needs no image or compression library.
// Public API of the trainer (plain C++17).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sciattn/status.h"

namespace sciattn::train {

inline constexpr int kPlotWidth = 800;
inline constexpr int kPlotHeight = 480;

// The loss (y) against the step (x) as a line, with axes, grid lines and labels for the
// extremes of both axes. Non-finite losses are left out. Fails with fewer than one finite point
// or when the file cannot be written.
Status write_loss_plot(const std::string& path, const std::vector<double>& steps,
                       const std::vector<double>& losses);

// The image itself (palette indices, kPlotWidth x kPlotHeight, row-major) and its PNG encoding,
// for tests.
std::vector<uint8_t> render_loss_plot(const std::vector<double>& steps,
                                      const std::vector<double>& losses);
std::vector<uint8_t> encode_png(const std::vector<uint8_t>& indices, int width, int height);

}  // namespace sciattn::train
