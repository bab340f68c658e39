// What the back ends of the trainer share beyond the interface (backend.h): the argument checks of
// strided_copy, so that the CPU and CUDA back ends refuse the same views with the same words.
// Trainer layer (host code).
#include "sciattn/train/backend.h"

#include <string>

namespace sciattn::train {

Status check_strided_copy(const StridedCopyParams& p, Device device, const char* memory) {
  const TensorView &src = p.src, &dst = p.dst;
  if (src.data == nullptr || dst.data == nullptr) {
    return Status::invalid_argument("strided_copy: src and dst must be present");
  }
  if (src.device != device || dst.device != device) {
    return Status::invalid_argument(std::string("strided_copy: src and dst must be in ") + memory);
  }
  bool same = src.rank == dst.rank && src.rank >= 1 && src.rank <= TensorView::kMaxRank &&
              src.dtype == dst.dtype;
  for (int d = 0; same && d < src.rank; ++d) same = src.sizes[d] == dst.sizes[d];
  if (!same) {
    return Status::invalid_argument(std::string("strided_copy: dst must have src's sizes and "
                                                "dtype (rank 1 to 6); got src ") +
                                    src.shape_string() + " " + dtype_name(src.dtype) + ", dst " +
                                    dst.shape_string() + " " + dtype_name(dst.dtype));
  }
  return Status::ok_status();
}

}  // namespace sciattn::train
