// Tensors of the training runtime: a shape, a dtype and a view into a Buffer that a Backend
// allocated (host memory on the CPU backend, device memory on CUDA). Tensors are cheap handles:
// copying one shares the buffer; the memory returns to its backend when the last handle goes.
// Letters in shape comments: b micro-batch, s sequence, h hidden, V vocabulary, t TP size.
#pragma once

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

}  // namespace ptdp::rt
