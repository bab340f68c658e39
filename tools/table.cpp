// A plain-text table for the command-line reports (see table.h). Tools layer.
#include "table.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <iomanip>

namespace sciattn::tools {

void TextTable::print(std::ostream& os) const {
  std::vector<size_t> width(header_.size(), 0);
  auto widen = [&](const std::vector<std::string>& row) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c)
      width[c] = std::max(width[c], row[c].size());
  };
  widen(header_);
  for (const auto& row : rows_) widen(row);
  auto print_row = [&](const std::vector<std::string>& row) {
    for (size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < row.size() ? row[c] : "";
      const bool numeric = !cell.empty() && (std::isdigit(static_cast<unsigned char>(cell[0])) ||
                                             cell[0] == '-' || cell[0] == '.');
      os << (c ? "  " : "") << (numeric ? std::right : std::left)
         << std::setw(static_cast<int>(width[c])) << cell;
    }
    os << "\n";
  };
  print_row(header_);
  size_t total = 0;
  for (size_t w : width) total += w;
  os << std::string(total + 2 * (width.size() - 1), '-') << "\n";
  for (const auto& row : rows_) print_row(row);
}

std::string fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  return buf;
}

std::string scientific(double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1e", value);
  return buf;
}

std::string human_bytes(size_t bytes) {
  const double b = static_cast<double>(bytes);
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  // Run estimates reach far past what a machine has; they still print in the largest unit.
  if (b >= kGiB * 1024.0 * 1024.0 * 1024.0)
    return fixed(b / (kGiB * 1024.0 * 1024.0 * 1024.0), 2) + " EiB";
  if (b >= kGiB * 1024.0 * 1024.0) return fixed(b / (kGiB * 1024.0 * 1024.0), 2) + " PiB";
  if (b >= kGiB * 1024.0) return fixed(b / (kGiB * 1024.0), 2) + " TiB";
  if (b >= kGiB) return fixed(b / kGiB, 2) + " GiB";
  if (b >= 1024.0 * 1024.0) return fixed(b / (1024.0 * 1024.0), 1) + " MiB";
  if (b >= 1024.0) return fixed(b / 1024.0, 0) + " KiB";
  return std::to_string(bytes) + " B";
}

}  // namespace sciattn::tools
