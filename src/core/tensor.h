// A dense, contiguous tensor: a shape, an element type and a view into shared storage.
// Storage comes from the accounting allocator, under a category, on a device.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/memory.h"

namespace mt {

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

class Storage {
 public:
  Storage(int64_t bytes, mem::Category c, mem::Device d) : block_(mem::allocate(bytes, c, d)) {}
  ~Storage() { mem::release(block_); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return block_.ptr; }
  int64_t bytes() const { return block_.bytes; }
  mem::Category category() const { return block_.category; }
  mem::Device device() const { return block_.device; }

 private:
  mem::Block block_;
};

class Tensor {
 public:
  Tensor() = default;
  // On the calling thread's device (core/device.h) unless one is named.
  static Tensor empty(const Shape& shape, DType dtype, mem::Category c);
  static Tensor empty(const Shape& shape, DType dtype, mem::Category c, mem::Device d);
  static Tensor zeros(const Shape& shape, DType dtype, mem::Category c);
  static Tensor zeros(const Shape& shape, DType dtype, mem::Category c, mem::Device d);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i < 0 ? i + static_cast<int>(shape_.size()) : i]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return numel_; }
  int64_t bytes() const { return numel_ * dtype_bytes(dtype_); }
  DType dtype() const { return dtype_; }
  mem::Device device() const { return storage_ ? storage_->device() : mem::Device::kCpu; }
  mem::Category category() const { return storage_->category(); }

  void* raw() const { return static_cast<char*>(storage_->data()) + offset_bytes_; }
  template <typename T>
  T* data() const {
    return static_cast<T*>(raw());
  }
  float* f32() const;  // checks dtype
  bf16* bf16p() const;

  // A view of `shape` starting `offset_elems` elements into this tensor; shares storage.
  Tensor view(int64_t offset_elems, const Shape& shape) const;
  Tensor reshape(const Shape& shape) const { return view(0, shape); }
  // Row i of the first dimension.
  Tensor operator[](int64_t i) const;

  void zero_();                       // on the tensor's device
  void copy_from(const Tensor& src);  // same numel and dtype; any two devices

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_bytes_ = 0;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::kF32;
};

}  // namespace mt
