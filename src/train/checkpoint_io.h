// What the training loop and the checkpoint code share (trainer.cpp, checkpoint_io.cpp): the
// writer of the checkpoint file format, which gradient dumps also use. Trainer layer (internal
// header, src/train only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sciattn/status.h"
#include "sciattn/train/gpt.h"
#include "train/json_util.h"

namespace sciattn::train::detail {

// A tensor to write: a name, dtype, shape and where its bytes are.
struct OutTensor {
  std::string name;
  const char* dtype;
  std::vector<int64_t> shape;
  const void* data;
  size_t bytes;
};

// Writes magic, header length, the header (padded so the data starts on 64 bytes) and the
// tensors, through a temporary file renamed into place (the format is at the top of trainer.h).
Status write_checkpoint_file(const std::string& path, Json header,
                             const std::vector<OutTensor>& tensors);

// The per-slot tensors of a flat buffer, named prefix/slot.
void add_slot_tensors(const ParameterLayout& layout, const std::string& prefix, const float* base,
                      std::vector<OutTensor>* out);

}  // namespace sciattn::train::detail
