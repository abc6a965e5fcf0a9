#pragma once
//! \file Memory for the CUDA backend: the resource concept user-supplied resources satisfy, the
//! default pinned-host and device resources, and the owning block an arena lives in.
//!
//! The concept is the shape of CCCL's `cuda::mr::resource` (allocate/deallocate with an
//! alignment), so CCCL and RMM-style resources plug in directly. CCCL 3.0.1 ships that concept
//! only behind LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE; tide states the same requirement
//! itself so that users need not enable experimental features, and checks against CCCL's concept
//! when it is enabled.

#include <cuda_runtime_api.h>

#include <concepts>
#include <cstddef>
#include <memory>
#include <optional>
#include <vector>
#include <type_traits>

#if defined(LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE)
#include <cuda/memory_resource>
#endif

#include <tide/backends/cuda/cuda_error.hpp>

namespace tide {

//! A memory resource: `allocate(bytes, alignment) -> void*` and `deallocate(p, bytes, alignment)`.
template <class R>
concept memory_resource = requires(R& r, void* p, std::size_t n, std::size_t a) {
  { r.allocate(n, a) } -> std::same_as<void*>;
  { r.deallocate(p, n, a) } -> std::same_as<void>;
};

//! Device memory from `cudaMalloc`.
struct device_memory_resource {
  void* allocate(std::size_t bytes, std::size_t /*alignment: cudaMalloc gives 256*/) {
    void* p = nullptr;
    TIDE_CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
  }
  void deallocate(void* p, std::size_t, std::size_t) noexcept { static_cast<void>(cudaFree(p)); }
  friend constexpr bool operator==(device_memory_resource const&, device_memory_resource const&) noexcept {
    return true;
  }
};

//! Page-locked host memory from `cudaHostAlloc`, so that copies run at full link bandwidth and
//! asynchronously with respect to the host. Portable: usable from every device's context.
struct pinned_memory_resource {
  void* allocate(std::size_t bytes, std::size_t /*alignment: page aligned*/) {
    void* p = nullptr;
    TIDE_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
    return p;
  }
  void deallocate(void* p, std::size_t, std::size_t) noexcept { static_cast<void>(cudaFreeHost(p)); }
  friend constexpr bool operator==(pinned_memory_resource const&, pinned_memory_resource const&) noexcept {
    return true;
  }
};

static_assert(memory_resource<device_memory_resource> && memory_resource<pinned_memory_resource>);
#if defined(LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE)
static_assert(::cuda::mr::resource<device_memory_resource> && ::cuda::mr::resource<pinned_memory_resource>);
#endif

//! A non-owning reference to any `memory_resource`; the resource must outlive the backend.
class resource_ref {
 public:
  template <memory_resource R>
    requires(!std::same_as<std::remove_cvref_t<R>, resource_ref>)
  resource_ref(R& r) noexcept  // NOLINT: implicit, like cuda::mr::resource_ref
      : obj_(std::addressof(r)),
        allocate_([](void* o, std::size_t n, std::size_t a) { return static_cast<R*>(o)->allocate(n, a); }),
        deallocate_([](void* o, void* p, std::size_t n, std::size_t a) noexcept {
          static_cast<R*>(o)->deallocate(p, n, a);
        }) {}

  void* allocate(std::size_t bytes, std::size_t alignment) const { return allocate_(obj_, bytes, alignment); }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) const noexcept {
    deallocate_(obj_, p, bytes, alignment);
  }

 private:
  void* obj_;
  void* (*allocate_)(void*, std::size_t, std::size_t);
  void (*deallocate_)(void*, void*, std::size_t, std::size_t) noexcept;
};

namespace detail {

//! One allocation from a resource, freed on destruction or when replaced by a larger one. It is
//! only reallocated when a later setup asks for more, so addresses are stable across steps.
class memory_block {
 public:
  memory_block() = default;
  memory_block(memory_block const&) = delete;
  memory_block& operator=(memory_block const&) = delete;
  ~memory_block() {
    release(data_, bytes_, alignment_, resource_);
    for (auto& b : retired_) release(b.data, b.bytes, b.alignment, b.resource);
  }

  //! At least `bytes` (at least one byte, so that even an empty arena has an address). A block
  //! replaced by a larger one is retired, not freed: an executor set up earlier on the same
  //! backend still holds its addresses. Retired blocks go back with the backend.
  std::byte* reserve(resource_ref r, std::size_t bytes, std::size_t alignment) {
    bytes = bytes == 0 ? 1 : bytes;
    if (data_ && bytes <= bytes_) return data_;
    auto* fresh = static_cast<std::byte*>(r.allocate(bytes, alignment));
    if (data_) retired_.push_back({data_, bytes_, alignment_, resource_});
    data_ = fresh;
    bytes_ = bytes;
    alignment_ = alignment;
    resource_.emplace(r);
    return data_;
  }
  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return data_ ? bytes_ : 0; }

 private:
  struct block {
    std::byte* data;
    std::size_t bytes, alignment;
    std::optional<resource_ref> resource;
  };
  static void release(std::byte* p, std::size_t n, std::size_t a, std::optional<resource_ref>& r) noexcept {
    if (p) r->deallocate(p, n, a);
  }
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0, alignment_ = 0;
  std::optional<resource_ref> resource_;
  std::vector<block> retired_;
};

}  // namespace detail
}  // namespace tide
