// libFuzzer target: DeepSpeed's JSON config (parse_deepspeed_sparsity_config) on arbitrary text,
// then, for a config it accepts, the layout and both index builds at a small length. The parser
// must return a Status for any input (no crash, leak or sanitizer report), and an accepted config
// must build. Test layer (tests/fuzz; built by the `fuzz` preset with clang's libFuzzer).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_support.h"
#include "sciattn/block_sparse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sciattn;
  // The first byte picks the head count and the seed; the rest is the JSON text.
  if (size == 0) return 0;
  const int64_t heads = 1 + data[0] % 4;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  SparsityConfig config;
  const Status s = parse_deepspeed_sparsity_config(text, heads, &config, data[0]);
  if (!s.ok()) {
    sciattn::fuzz::require(!s.message().empty(), "a rejection without a message");
    return 0;
  }
  sciattn::fuzz::require(validate_sparsity_config(config).ok(),
                         "an accepted config that validate_sparsity_config rejects");
  sciattn::fuzz::check_layout_and_indexes(config, data[0] % 8 + 1);
  return 0;
}
