// The single-rank communicator. Trainer layer (host code).
#include "sciattn/train/communicator.h"

#include <string>

namespace sciattn::train {

Status SingleRankCommunicator::all_reduce_mean(float*, int64_t n) {
  if (n < 0) return Status::invalid_argument("all_reduce_mean: n must be >= 0");
  return Status::ok_status();
}

}  // namespace sciattn::train
