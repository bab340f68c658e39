// How a kernel may copy the rows of a [.., L, .., D] slice into shared memory (SliceSource::vec,
// the Evoformer parameters' vec_q, vec_k, vec_v, vec_dout), decided by the host from the tensor's
// dtype, alignment and strides. CUDA layer; plain C++ so that host code fills the kernels'
// arguments without device headers.
#pragma once

namespace sciattn::cuda {

// kRowsElementwise: element by element (the staged copies' case: rows on 2-byte boundaries whose
// slices mix parities, or the rare strided view); kRowsInChunks: whole 16-byte chunks (every row
// 16-byte aligned, D a multiple of 8 16-bit elements); kRowsInPieces: 16-byte chunks copied as
// four 4-byte pieces (16-bit rows on 4-byte boundaries: an even D, or a view off a 16-byte
// boundary), the pieces past D zero-filled; kRowsShifted: 16-bit rows on 2-byte boundaries (an odd
// D) whose row stride is even, so that every row of a (b, n, h) slice starts on the same 4-byte
// parity: a slice that starts on a 2-byte boundary is read in pieces from one element before each
// row (its shift, 1; slice_of), the kernels zeroing that column after the copy and storing their
// outputs' rows one column over.
enum RowCopy : int { kRowsElementwise = 0, kRowsInChunks = 1, kRowsInPieces = 2, kRowsShifted = 3 };

}  // namespace sciattn::cuda
