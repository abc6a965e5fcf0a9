#pragma once
//! \file
//! NVTX3 ranges in the `tide` domain, named like tide's own trace ("forward L3",
//! "offload L3 q_proj 1/4"), so that an Nsight Systems timeline reads like a tide timeline. Ranges
//! are pushed on the host around the enqueueing of each op; Nsight Systems projects them onto the
//! CUDA stream the op's kernels and copies ran on.
//!
//! Names are formatted into a stack buffer: NVTX copies the message, and nothing is allocated.

#include <nvtx3/nvtx3.hpp>

#include <cstdint>
#include <cstdio>
#include <span>
#include <string_view>

#include <tide/core/op.hpp>

namespace tide {

//! The NVTX domain of every range tide emits.
struct nvtx_domain {
  static constexpr char const* name{"tide"};  //!< the domain's name, as Nsight Systems shows it
};

namespace detail {

//! One colour per op kind, so kinds are told apart at a glance.
constexpr nvtx3::rgb nvtx_color(op_kind k) noexcept {
  switch (k) {
    case op_kind::forward: return {0x4c, 0xaf, 0x50};
    case op_kind::recompute: return {0xff, 0x98, 0x00};
    case op_kind::advance: return {0xff, 0xc1, 0x07};
    case op_kind::backward: return {0x21, 0x96, 0xf3};
    case op_kind::offload: return {0x9c, 0x27, 0xb0};
    case op_kind::prefetch: return {0x00, 0xbc, 0xd4};
    case op_kind::gather:
    case op_kind::regather:
    case op_kind::reduce: return {0xf4, 0x43, 0x36};
    case op_kind::store:
    case op_kind::load: return {0x79, 0x55, 0x48};
    case op_kind::send:
    case op_kind::receive: return {0x60, 0x7d, 0x8b};
  }
  return {0x80, 0x80, 0x80};
}

}  // namespace detail

//! A range in the `tide` domain for the lifetime of the object (or nothing when `enabled` is false).
class nvtx_op_range {
 public:
  //! Pushes a range named like `o` in tide's trace (with `slot_name` for a copy), coloured by kind.
  nvtx_op_range(bool enabled, op const& o, std::string_view slot_name = {}) noexcept : enabled_(enabled) {
    if (!enabled_) return;
    char buf[128];
    write_op_label(buf, o, slot_name);
    nvtx3::event_attributes const attr{nvtx3::message{static_cast<char const*>(buf)}, detail::nvtx_color(o.kind)};
    nvtxDomainRangePushEx(nvtx3::domain::get<nvtx_domain>(), attr.get());
  }
  nvtx_op_range(nvtx_op_range const&) = delete;
  nvtx_op_range& operator=(nvtx_op_range const&) = delete;
  ~nvtx_op_range() {
    if (enabled_) nvtxDomainRangePop(nvtx3::domain::get<nvtx_domain>());
  }

 private:
  bool enabled_;
};

//! Pushes a named range in the `tide` domain (e.g. "step 12"); pair with `nvtx_pop`.
inline void nvtx_push(char const* name) noexcept {
  nvtx3::event_attributes const attr{nvtx3::message{name}, nvtx3::rgb{0x60, 0x60, 0x60}};
  nvtxDomainRangePushEx(nvtx3::domain::get<nvtx_domain>(), attr.get());
}
//! Pops the range of the matching `nvtx_push`.
inline void nvtx_pop() noexcept { nvtxDomainRangePop(nvtx3::domain::get<nvtx_domain>()); }

}  // namespace tide
