// Tensor views over backend buffers; see tensor.h.
#include "runtime/tensor.h"

#include <cassert>
#include <sstream>

namespace ptdp::rt {

size_t DTypeBytes(DType d) {
  switch (d) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kI32: return 4;
  }
  return 4;
}

const char* ToString(DType d) {
  switch (d) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kI32: return "i32";
  }
  return "?";
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string Shape::ToString() const {
  std::ostringstream o;
  o << "(";
  for (size_t i = 0; i < dims.size(); ++i) o << (i ? ", " : "") << dims[i];
  o << ")";
  return o.str();
}

Tensor::Tensor(std::shared_ptr<Buffer> buf, Shape shape, DType dtype, int64_t offset_elems)
    : buf_(std::move(buf)), shape_(std::move(shape)), dtype_(dtype), offset_(offset_elems) {
  assert(!buf_ || size_t(offset_ + shape_.numel()) * DTypeBytes(dtype_) <= buf_->bytes());
}

void* Tensor::data() const {
  if (!buf_) return nullptr;
  return static_cast<char*>(buf_->data()) + offset_ * int64_t(DTypeBytes(dtype_));
}

Tensor Tensor::View(Shape shape, int64_t offset_elems) const {
  return Tensor(buf_, std::move(shape), dtype_, offset_ + offset_elems);
}

Tensor Tensor::Slice0(int64_t i) const {
  std::vector<int64_t> rest(shape_.dims.begin() + 1, shape_.dims.end());
  Shape s(rest);
  return View(s, i * s.numel());
}

}  // namespace ptdp::rt
