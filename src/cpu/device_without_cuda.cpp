// Device queries for a build without CUDA (SCIATTN_WITH_CUDA=OFF). CPU layer.
#include "sciattn/device.h"

namespace sciattn {

bool built_with_cuda() {
  return false;
}
int cuda_device_count() {
  return 0;
}

}  // namespace sciattn
