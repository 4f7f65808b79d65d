// Tensor views: shapes, offsets, slices share one buffer; the buffer returns when the last
// view goes.
#include "runtime/tensor.h"

#include <gtest/gtest.h>

namespace ptdp::rt {
namespace {

std::shared_ptr<Buffer> HostBuffer(size_t bytes, int* released) {
  return std::make_shared<Buffer>(new float[bytes / 4](), bytes, [released](void* p, size_t) {
    delete[] static_cast<float*>(p);
    ++*released;
  });
}

TEST(Tensor, ShapeAndBytes) {
  EXPECT_EQ(Shape({2, 3, 4}).numel(), 24);
  EXPECT_EQ(Shape({2, 3, 4}).ToString(), "(2, 3, 4)");
  EXPECT_EQ(Shape().numel(), 1);  // a scalar
  EXPECT_EQ(DTypeBytes(DType::kBF16), 2u);
}

TEST(Tensor, ViewsShareTheBufferAndReleaseOnce) {
  int released = 0;
  {
    Tensor t(HostBuffer(24 * 4, &released), Shape{2, 3, 4}, DType::kF32);
    for (int i = 0; i < 24; ++i) t.data_as<float>()[i] = float(i);
    // Slice0(1) is the second (3, 4) block: elements 12..23.
    Tensor s = t.Slice0(1);
    EXPECT_EQ(s.shape(), (Shape{3, 4}));
    EXPECT_EQ(s.data_as<float>()[0], 12.0f);
    // A view 5 elements into the slice: element 17.
    Tensor v = s.View(Shape{2}, 5);
    EXPECT_EQ(v.data_as<float>()[1], 18.0f);
    EXPECT_EQ(v.bytes(), 8u);
    t = Tensor();
    EXPECT_EQ(released, 0);  // s and v still hold the buffer
  }
  EXPECT_EQ(released, 1);
}

}  // namespace
}  // namespace ptdp::rt
