#pragma once
//! \file
//! Memory for the CUDA backend: the resource concept user-supplied resources satisfy, the
//! default pinned-host and device resources, and the pool an arena lives in.
//!
//! The concept is the shape of CCCL's `cuda::mr::resource` (allocate/deallocate with an
//! alignment), so CCCL and RMM-style resources plug in directly. CCCL 3.0.1 ships that concept
//! only behind LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE; tide states the same requirement
//! itself so that users need not enable experimental features, and checks against CCCL's concept
//! when it is enabled.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>

#if defined(LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE)
#include <cuda/memory_resource>
#endif

#include <tide/backends/cuda/cuda_error.hpp>
#include <tide/executor/arena_pool.hpp>

namespace tide {

//! A memory resource: `allocate(bytes, alignment) -> void*` and `deallocate(p, bytes, alignment)`.
template <class R>
concept memory_resource = requires(R& r, void* p, std::size_t n, std::size_t a) {
  { r.allocate(n, a) } -> std::same_as<void*>;
  { r.deallocate(p, n, a) } -> std::same_as<void>;
};

//! Device memory from `cudaMalloc`.
struct device_memory_resource {
  //! `bytes` from `cudaMalloc`, which aligns to 256 bytes whatever is asked; throws `cuda_error`.
  void* allocate(std::size_t bytes, std::size_t /*alignment: cudaMalloc gives 256*/) {
    void* p = nullptr;
    TIDE_CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
  }
  //! `cudaFree`; errors are ignored (it runs on teardown paths).
  void deallocate(void* p, std::size_t, std::size_t) noexcept { static_cast<void>(cudaFree(p)); }
  friend constexpr bool operator==(device_memory_resource const&, device_memory_resource const&) noexcept {
    return true;
  }
};

//! Page-locked host memory from `cudaHostAlloc`, so that copies run at full link bandwidth and
//! asynchronously with respect to the host. Portable: usable from every device's context.
struct pinned_memory_resource {
  //! `bytes` from `cudaHostAlloc`, page aligned whatever is asked; throws `cuda_error`.
  void* allocate(std::size_t bytes, std::size_t /*alignment: page aligned*/) {
    void* p = nullptr;
    TIDE_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
    return p;
  }
  //! `cudaFreeHost`; errors are ignored (it runs on teardown paths).
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
  //! Refers to `r`, which must outlive the reference.
  template <memory_resource R>
    requires(!std::same_as<std::remove_cvref_t<R>, resource_ref>)
  resource_ref(R& r) noexcept  // NOLINT: implicit, like cuda::mr::resource_ref
      : obj_(std::addressof(r)),
        allocate_([](void* o, std::size_t n, std::size_t a) { return static_cast<R*>(o)->allocate(n, a); }),
        deallocate_([](void* o, void* p, std::size_t n, std::size_t a) noexcept {
          static_cast<R*>(o)->deallocate(p, n, a);
        }) {}

  //! Forwards to the resource's `allocate`.
  void* allocate(std::size_t bytes, std::size_t alignment) const { return allocate_(obj_, bytes, alignment); }
  //! Forwards to the resource's `deallocate`.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) const noexcept {
    deallocate_(obj_, p, bytes, alignment);
  }

 private:
  void* obj_;
  void* (*allocate_)(void*, std::size_t, std::size_t);
  void (*deallocate_)(void*, void*, std::size_t, std::size_t) noexcept;
};

namespace detail {

//! A resource with a fixed alignment, as the allocator of an arena_pool: the CUDA backend's
//! arenas follow the same policy as the host backend's (see <tide/executor/arena_pool.hpp>).
struct resource_allocator {
  resource_ref resource;
  std::size_t alignment = 256;  //!< at least this (cudaMalloc's 256, a page for cudaHostAlloc)
  //! Called on each new block before its alignment is judged (the CUDA backend checks a user
  //! resource's memory kind here): pageable memory is then reported as pageable, not as
  //! misaligned. Throws to refuse the block, which is given back.
  std::function<void(void const*)> check_kind;
  //! Throws `error` when the resource ignored an alignment larger than it guarantees (cudaMalloc
  //! promises 256 bytes, cudaHostAlloc a page): slots would then be misaligned silently.
  std::byte* allocate(std::size_t bytes, std::size_t a) {
    a = std::max(a, alignment);
    auto* p = static_cast<std::byte*>(resource.allocate(bytes, a));
    if (p && check_kind) {
      try {
        check_kind(p);
      } catch (...) {
        resource.deallocate(p, bytes, a);
        throw;
      }
    }
    if (p && reinterpret_cast<std::uintptr_t>(p) % a != 0) {
      resource.deallocate(p, bytes, a);
      throw error("tide: CUDA backend: the memory resource returned a block aligned to less than the schedule's " +
                  std::to_string(a) + "-byte alignment: use a resource that honours the alignment, or ask for a "
                  "smaller one (buffer_spec::device_alignment and host_alignment; tide::device_alignment<N>, "
                  "tide::host_alignment<N>)");
    }
    return p;
  }
  void deallocate(std::byte* p, std::size_t bytes, std::size_t a) noexcept {
    resource.deallocate(p, bytes, std::max(a, alignment));
  }
};

//! An arena's memory: one block reused while it fits, replaced by a larger one when a setup
//! needs more; a replaced block is freed once no executor holds it.
using memory_block = arena_pool<resource_allocator>;

}  // namespace detail
}  // namespace tide
