// The public functions of the block-sparse layouts: build a config's layout (for a length, or
// cropped from a longer one), describe a layout, and read DeepSpeed's JSON configs. They hand the
// work to the layout algorithms (src/common/sparsity_layouts.cpp) and the JSON parser
// (src/common/deepspeed_config.cpp). The one entry point of each.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "common/allocation_status.h"
#include "common/deepspeed_config.h"
#include "common/sparsity_layouts.h"
#include "sciattn/block_sparse.h"

namespace sciattn {

int64_t layout_nnz(const Layout& layout) {
  int64_t nnz = 0;
  for (uint8_t b : layout.blocks) nnz += b != 0 ? 1 : 0;
  return nnz;
}

int64_t layout_head_nnz(const Layout& layout, int64_t head) {
  if (head < 0 || head >= layout.num_heads) return 0;
  int64_t nnz = 0;
  for (int64_t r = 0; r < layout.num_row_blocks; ++r) {
    for (int64_t c = 0; c < layout.num_col_blocks; ++c) nnz += layout.at(head, r, c) != 0 ? 1 : 0;
  }
  return nnz;
}

double layout_density(const Layout& layout) {
  const int64_t size = layout.size();
  return size == 0 ? 0.0 : static_cast<double>(layout_nnz(layout)) / static_cast<double>(size);
}

int64_t layout_max_row_nnz(const Layout& layout) {
  int64_t best = 0;
  for (int64_t h = 0; h < layout.num_heads; ++h) {
    for (int64_t r = 0; r < layout.num_row_blocks; ++r) {
      int64_t row = 0;
      for (int64_t c = 0; c < layout.num_col_blocks; ++c) row += layout.at(h, r, c) != 0 ? 1 : 0;
      best = std::max(best, row);
    }
  }
  return best;
}

bool layout_is_block_causal(const Layout& layout) {
  for (int64_t h = 0; h < layout.num_heads; ++h) {
    for (int64_t r = 0; r < layout.num_row_blocks; ++r) {
      for (int64_t c = r + 1; c < layout.num_col_blocks; ++c) {
        if (layout.at(h, r, c) != 0) return false;
      }
    }
  }
  return true;
}

std::string layout_to_string(const Layout& layout) {
  std::string text;
  for (int64_t h = 0; h < layout.num_heads; ++h) {
    text += "head " + std::to_string(h) + ":\n";
    for (int64_t r = 0; r < layout.num_row_blocks; ++r) {
      for (int64_t c = 0; c < layout.num_col_blocks; ++c) text += layout.at(h, r, c) ? '1' : '0';
      text += '\n';
    }
  }
  return text;
}

Status make_layout(const SparsityConfig& config, int64_t seq_len, Layout* out) {
  return detail::status_of_allocating("make_layout", [&] {
    return detail::build_layout(config, seq_len, detail::LayoutBuildOptions{}, out);
  });
}

Status crop_layout(const Layout& full, int64_t block, int64_t seq_len, Layout* out) {
  Status valid = detail::check_crop(full.num_row_blocks, full.num_col_blocks, block, seq_len);
  if (!valid.ok()) return valid;
  const int64_t n = seq_len / block;
  return detail::status_of_allocating("crop_layout", [&] {
    Layout crop = Layout::zeros(full.num_heads, n, n);
    for (int64_t h = 0; h < full.num_heads; ++h) {
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t c = 0; c < n; ++c) crop.at(h, r, c) = full.at(h, r, c);
      }
    }
    *out = std::move(crop);
    return Status::ok_status();
  });
}

Status make_layout_for_length(const SparsityConfig& config, int64_t max_seq_length, int64_t seq_len,
                              Layout* out) {
  Status lengths = detail::check_length_for_crop(max_seq_length, seq_len);
  if (!lengths.ok()) return lengths;
  Layout full;
  Status s = make_layout(config, max_seq_length, &full);
  if (!s.ok()) return s;
  return crop_layout(full, sparsity_common(config).block, seq_len, out);
}

Status parse_deepspeed_sparsity_config(std::string_view json_text, int64_t num_heads,
                                       SparsityConfig* out, uint64_t seed) {
  return detail::status_of_allocating("parse_deepspeed_sparsity_config", [&] {
    return detail::parse_deepspeed_sparsity_text(json_text, num_heads, seed, out);
  });
}

Status load_deepspeed_sparsity_config(const std::string& path, int64_t num_heads,
                                      SparsityConfig* out, uint64_t seed) {
  return detail::status_of_allocating("load_deepspeed_sparsity_config", [&] {
    return detail::load_deepspeed_sparsity_file(path, num_heads, seed, out);
  });
}

}  // namespace sciattn
