// encode_tile_map (common/tensor_map.h): cuTensorMapEncodeTiled through the runtime's driver
// entry point, looked up once. CUDA layer (host code).
#include <cuda.h>
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "cuda/common/tensor_map.h"

namespace sciattn::cuda {
namespace {

static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) && alignof(TensorMap) >= 64,
              "TensorMap holds a CUtensorMap");

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled (its CUDA 12.0 form, the first with tensor maps), or
// nullptr with the runtime's answer in `failure`.
EncodeTiled encoder(std::string* failure) {
  static std::once_flag once;
  static EncodeTiled fn = nullptr;
  static std::string why;
  std::call_once(once, [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000,
                                                           cudaEnableDefault, &found);
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || entry == nullptr) {
      why = std::string("cuTensorMapEncodeTiled not found in the driver (") +
            cudaGetErrorString(e) + ")";
      return;
    }
    fn = reinterpret_cast<EncodeTiled>(entry);
  });
  if (fn == nullptr) *failure = why;
  return fn;
}

}  // namespace

Status encode_tile_map(const TileMapShape& shape, TensorMap* map) {
  if (!tile_map_shape_valid(shape)) {
    return Status::invalid_argument(
        "encode_tile_map: the shape breaks the tensor-map rules (tile_map_shape_valid)");
  }
  std::string failure;
  const EncodeTiled encode = encoder(&failure);
  if (encode == nullptr) return Status(StatusCode::kDeviceError, "encode_tile_map: " + failure);
  cuuint64_t dims[5], strides[4];
  cuuint32_t box[5], element_strides[5];
  for (int i = 0; i < shape.rank; ++i) {
    dims[i] = shape.dims[i];
    box[i] = shape.box[i];
    element_strides[i] = 1;
    if (i > 0) strides[i - 1] = shape.strides[i - 1];
  }
  const CUresult r =
      encode(reinterpret_cast<CUtensorMap*>(map), CU_TENSOR_MAP_DATA_TYPE_UINT16,
             static_cast<cuuint32_t>(shape.rank), const_cast<void*>(shape.base), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             shape.swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return Status(StatusCode::kDeviceError,
                  "encode_tile_map: cuTensorMapEncodeTiled failed with CUresult " +
                      std::to_string(static_cast<int>(r)));
  }
  return Status::ok_status();
}

}  // namespace sciattn::cuda
