#include "core/tensor.h"

#include "core/device.h"

#include <cstring>

#include "core/error.h"

namespace mt {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Tensor Tensor::empty(const Shape& shape, DType dtype, mem::Category c, mem::Device d) {
  for (int64_t x : shape)
    if (x < 0) fail("negative dimension in tensor shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(t.numel_ * dtype_bytes(dtype), c, d);
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, mem::Category c) {
  return empty(shape, dtype, c, device::current());
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, mem::Category c) {
  return zeros(shape, dtype, c, device::current());
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, mem::Category c, mem::Device d) {
  Tensor t = empty(shape, dtype, c, d);
  t.zero_();
  return t;
}

float* Tensor::f32() const {
  MT_ASSERT(dtype_ == DType::kF32);
  return data<float>();
}

bf16* Tensor::bf16p() const {
  MT_ASSERT(dtype_ == DType::kBF16);
  return data<bf16>();
}

Tensor Tensor::view(int64_t offset_elems, const Shape& shape) const {
  int64_t n = shape_numel(shape);
  MT_ASSERT(offset_elems >= 0 && offset_elems + n <= numel_);
  Tensor t = *this;
  t.offset_bytes_ += offset_elems * dtype_bytes(dtype_);
  t.shape_ = shape;
  t.numel_ = n;
  return t;
}

Tensor Tensor::operator[](int64_t i) const {
  MT_ASSERT(!shape_.empty() && i >= 0 && i < shape_[0]);
  Shape rest(shape_.begin() + 1, shape_.end());
  return view(i * shape_numel(rest), rest);
}

void Tensor::zero_() {
  if (numel_) device::zero(raw(), device(), bytes());
}

void Tensor::copy_from(const Tensor& src) {
  MT_ASSERT(src.numel_ == numel_ && src.dtype_ == dtype_);
  if (numel_) device::copy(raw(), device(), src.raw(), src.device(), bytes());
}

}  // namespace mt
