// A plain-text table for the command-line reports. Tools layer.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace sciattn::tools {

class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) : header_(std::move(header)) {}
  void add_row(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // Columns padded to their widest cell; numbers (cells starting with a digit) right-aligned.
  void print(std::ostream& os) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// "12.3" with `digits` after the point.
std::string fixed(double value, int digits);
// "1.2e-07".
std::string scientific(double value);
// "3.4 MiB", "812 KiB", "0 B", "2.50 TiB".
std::string human_bytes(size_t bytes);

}  // namespace sciattn::tools
