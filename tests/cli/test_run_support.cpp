// The command-line program's host buffers (tools/run_support.h): a copy owns its storage and its
// view points into it, which the GPU runs rely on (a device upload places the view by its offset
// into the buffer's bytes). Test layer (tests/cli), label cpu.
#include <gtest/gtest.h>

#include <cstddef>
#include <utility>

#include "run_support.h"

namespace sciattn::tools {
namespace {

const std::byte* begin_of(const HostBuffer& b) {
  return b.bytes.data();
}
const std::byte* data_of(const HostBuffer& b) {
  return static_cast<const std::byte*>(b.view.data);
}

TEST(HostBuffer, CopyPointsIntoItsOwnBytes) {
  HostBuffer original = make_host_buffer(DType::kF32, {2, 3});
  HostBuffer copy = original;
  EXPECT_NE(begin_of(copy), begin_of(original));
  EXPECT_EQ(data_of(copy), begin_of(copy));
  HostBuffer assigned;
  assigned = original;
  EXPECT_EQ(data_of(assigned), begin_of(assigned));
  EXPECT_EQ(assigned.view.sizes[1], 3);
}

TEST(HostBuffer, CopyKeepsTheViewOffset) {
  HostBuffer original = make_host_buffer(DType::kF32, {4});
  original.view.data = original.bytes.data() + 8;  // a view starting at element 2
  const HostBuffer copy = original;
  EXPECT_EQ(data_of(copy) - begin_of(copy), 8);
}

TEST(HostBuffer, MoveKeepsTheStorage) {
  HostBuffer original = make_host_buffer(DType::kF32, {5});
  const std::byte* storage = begin_of(original);
  const HostBuffer moved = std::move(original);
  EXPECT_EQ(begin_of(moved), storage);
  EXPECT_EQ(data_of(moved), storage);
}

TEST(HostBuffer, AnAbsentBufferStaysAbsent) {
  const HostBuffer empty;
  const HostBuffer copy = empty;
  EXPECT_EQ(copy.view.data, nullptr);
}

}  // namespace
}  // namespace sciattn::tools
