// Hopper's tensor copies (TMA, cp.async.bulk.tensor) read tiles through tensor maps, which the
// driver encodes on the host: what a map of 16-bit rows describes (TileMapShape), the storage a
// kernel parameter struct holds it in (TensorMap), and the encoding. CUDA layer (host code; the
// structs need no CUDA header, so host code built without nvcc can fill parameter structs).
#pragma once

#include <cstdint>

#include "sciattn/status.h"

namespace sciattn::cuda {

// The storage of a CUtensorMap (cuda.h: 128 bytes, 64-byte aligned), for parameter structs passed
// to kernels as __grid_constant__, whose copies the tensor-copy instructions read in place.
struct alignas(64) TensorMap {
  uint64_t words[16];
};

// A tiled map of a 16-bit tensor (cuTensorMapEncodeTiled's arguments): `rank` dimensions of
// `dims` elements, innermost first, the innermost contiguous and the others `strides` bytes apart
// (strides[i] for dims[i + 1]: multiples of 16), from `base` (16-byte aligned). A copy reads the
// box of `box` elements whose first element has the given coordinates (any, in bounds or not:
// elements outside the dims read as zeros), into shared memory in the swizzle of `swizzle_bytes`
// (64 or 128: the box's inner extent, box[0] x 2 bytes, is that many bytes, as the wgmma tiles'
// rows are: cuda/common/wgmma.cuh).
struct TileMapShape {
  const void* base = nullptr;
  int rank = 0;
  uint64_t dims[5] = {};
  uint64_t strides[4] = {};
  uint32_t box[5] = {};
  int swizzle_bytes = 0;
};

// Whether `shape` meets the encoder's rules (checked before a call commits to tensor copies):
// rank 1..5, base 16-byte aligned, dims 1..2^32, strides multiples of 16 below 2^40, box extents
// 1..256 with box[0] x 2 = swizzle_bytes (64 or 128).
inline bool tile_map_shape_valid(const TileMapShape& shape) {
  if (shape.rank < 1 || shape.rank > 5) return false;
  if (reinterpret_cast<uintptr_t>(shape.base) % 16 != 0) return false;
  if (shape.swizzle_bytes != 64 && shape.swizzle_bytes != 128) return false;
  if (2 * static_cast<int>(shape.box[0]) != shape.swizzle_bytes) return false;
  for (int i = 0; i < shape.rank; ++i) {
    if (shape.dims[i] < 1 || shape.dims[i] > (uint64_t{1} << 32)) return false;
    if (shape.box[i] < 1 || shape.box[i] > 256) return false;
    if (i > 0) {
      const uint64_t stride = shape.strides[i - 1];
      if (stride % 16 != 0 || stride == 0 || stride >= (uint64_t{1} << 40)) return false;
    }
  }
  return true;
}

// Encodes `shape` into `map` (cuTensorMapEncodeTiled, reached through the CUDA runtime's driver
// entry point, so that the library does not link the driver itself; elements past the dims read
// as zeros). Errors: invalid_argument for a shape tile_map_shape_valid rejects; kDeviceError when
// the driver has no tensor maps or rejects the shape, with its result code.
Status encode_tile_map(const TileMapShape& shape, TensorMap* map);

}  // namespace sciattn::cuda
