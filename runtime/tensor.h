// Tensors of the training runtime: a shape, a dtype and a view into a Buffer that a Backend
// allocated (host memory on the CPU backend, device memory on CUDA). Tensors are cheap handles:
// copying one shares the buffer; the memory returns to its backend when the last handle goes.
// Letters in shape comments: b micro-batch, s sequence, h hidden, V vocabulary, t TP size.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace ptdp::rt {

enum class DType { kF32, kBF16, kI32 };
size_t DTypeBytes(DType d);
const char* ToString(DType d);

struct Shape {
  std::vector<int64_t> dims;
  Shape() = default;
  Shape(std::initializer_list<int64_t> d) : dims(d) {}
  explicit Shape(std::vector<int64_t> d) : dims(std::move(d)) {}
  int64_t numel() const;
  int rank() const { return int(dims.size()); }
  int64_t operator[](int i) const { return dims[size_t(i)]; }
  bool operator==(const Shape& o) const { return dims == o.dims; }
  std::string ToString() const;  // "(2, 64, 128)"
};

// A block of memory from a backend. `release` (set by the backend) returns it and updates the
// backend's accounting; it runs when the last Tensor holding the buffer goes away.
class Buffer {
 public:
  Buffer(void* data, size_t bytes, std::function<void(void*, size_t)> release)
      : data_(data), bytes_(bytes), release_(std::move(release)) {}
  ~Buffer() { if (release_) release_(data_, bytes_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
  std::function<void(void*, size_t)> release_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: no buffer
  // A view of `shape` starting `offset_elems` elements into `buf`. Precondition: it fits.
  Tensor(std::shared_ptr<Buffer> buf, Shape shape, DType dtype, int64_t offset_elems = 0);

  bool defined() const { return buf_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return shape_.numel(); }
  size_t bytes() const { return size_t(numel()) * DTypeBytes(dtype_); }
  // Start of this view. Host-addressable only on the CPU backend; device pointer on CUDA.
  void* data() const;
  template <typename T>
  T* data_as() const { return static_cast<T*>(data()); }
  // Another view of the same buffer: `shape` starting `offset_elems` into this view
  // (Precondition: it fits). Reshape is View(new_shape, 0) with the same numel.
  Tensor View(Shape shape, int64_t offset_elems = 0) const;
  // The i-th slice along dimension 0 (a view), e.g. one micro-batch of (m, b, s, h).
  Tensor Slice0(int64_t i) const;
  const std::shared_ptr<Buffer>& buffer() const { return buf_; }

 private:
  std::shared_ptr<Buffer> buf_;
  Shape shape_;
  DType dtype_ = DType::kF32;
  int64_t offset_ = 0;  // elements
};

// The tensor read as 2-D (N, C): C the last dimension, N the product of the others (the Backend
// convention, backend.h).
inline int64_t Cols(const Tensor& t) {
  return t.shape().rank() == 0 ? 1 : t.shape()[t.shape().rank() - 1];
}
inline int64_t Rows(const Tensor& t) { return Cols(t) == 0 ? 0 : t.numel() / Cols(t); }

// Typed pointers to a tensor's data; the dtype is asserted (our invariant, not user input).
inline const float* F32(const Tensor& t) {
  assert(t.defined() && t.dtype() == DType::kF32);
  return t.data_as<const float>();
}
inline float* MutF32(Tensor& t) {
  assert(t.defined() && t.dtype() == DType::kF32);
  return t.data_as<float>();
}
inline const int32_t* I32(const Tensor& t) {
  assert(t.defined() && t.dtype() == DType::kI32);
  return t.data_as<const int32_t>();
}

}  // namespace ptdp::rt
