#pragma once
//! \file Hardware descriptions: compute throughput, HBM capacity and bandwidth, and the host
//! link. Presets carry public datasheet numbers (sources below); every field can be overridden,
//! and a calibrated link (`calibrate.hpp`) replaces the nominal one with measured bandwidth.
//!
//! Sources (vendor datasheets and the PCI-SIG base specification):
//! - H100 SXM5: 989 TFLOP/s dense BF16 (1,979 with sparsity), 80 GB HBM3 at 3.35 TB/s.
//!   NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/
//! - H200 SXM: 989 TFLOP/s dense BF16, 141 GB HBM3e at 4.8 TB/s.
//!   NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/
//! - PCIe Gen5 x16: 32 GT/s per lane, 16 lanes, 128b/130b encoding: 63.0 GB/s per direction.
//!   PCI Express Base Specification 5.0 (PCI-SIG, 2019).
//! - GH200 Grace Hopper: H100 GPU (989 TFLOP/s dense BF16) with 96 GB HBM3 at 4 TB/s; NVLink-C2C
//!   900 GB/s bidirectional (450 GB/s per direction) between Grace and the GPU.
//!   NVIDIA GH200 Grace Hopper Superchip datasheet, https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/
//! - GB200 Grace Blackwell: per Blackwell GPU 2.5 PFLOP/s dense BF16 (the NVL72 rack's 360
//!   PFLOP/s FP16/BF16 is with sparsity, for 72 GPUs), 186 GB HBM3e at 8 TB/s; NVLink-C2C 900 GB/s
//!   bidirectional from Grace, shared by the superchip's two GPUs.
//!   NVIDIA GB200 NVL72 datasheet, https://www.nvidia.com/en-us/data-center/gb200-nvl72/
//!
//! Achieved rates are below these peaks. `mfu` (the share of peak FLOP/s a layer's matrix
//! products reach) and `link_efficiency` (the share of nominal link bandwidth a pinned copy
//! reaches) default to assumptions stated next to them; replace them with measured values.

#include <cstddef>
#include <string>
#include <string_view>

#include <tide/backends/sim/cost_table.hpp>

namespace tide {

struct hardware_spec {
  std::string_view name;
  double dense_flops = 0;          //!< peak dense BF16 FLOP/s
  std::size_t hbm_bytes = 0;       //!< device memory capacity
  double hbm_bytes_per_second = 0; //!< device memory bandwidth (elementwise ops are bound by it)
  double link_bytes_per_second = 0;  //!< nominal host link bandwidth, per direction
  double link_latency_s = 5e-6;      //!< per-copy latency (launch and DMA setup)
  bool link_full_duplex = true;      //!< both PCIe and NVLink-C2C are full duplex
  //! Share of peak FLOP/s that large BF16 matrix products and attention reach in training.
  //! 0.5 is a typical model-FLOP utilization for large dense training runs; replace with yours.
  double mfu = 0.5;
  //! Share of nominal link bandwidth a large pinned copy reaches (PCIe packet overhead and DMA
  //! efficiency). 0.85 is an assumption; `calibrate_link` measures it.
  double link_efficiency = 0.85;
  std::string_view source;  //!< where the numbers come from

  //! The host link as the cost model uses it (achieved rates).
  constexpr link_spec link() const noexcept {
    auto const bw = link_bytes_per_second * link_efficiency;
    return {{bw, link_latency_s}, {bw, link_latency_s}, link_full_duplex};
  }
  //! Seconds for `flops` of matrix work.
  constexpr double matmul_seconds(double flops) const noexcept { return flops / (dense_flops * mfu); }
  //! Seconds to stream `bytes` through HBM (read plus write counted by the caller).
  constexpr double memory_seconds(double bytes) const noexcept { return bytes / hbm_bytes_per_second; }
};

namespace hardware {

inline constexpr double pcie5_x16_bytes_per_second = 32e9 * 16 * 128.0 / 130.0 / 8.0;  // 63.0 GB/s
inline constexpr double nvlink_c2c_bytes_per_second = 450e9;                         // per direction

//! H100 SXM5 80 GB with a PCIe Gen5 x16 host link.
constexpr hardware_spec h100_sxm() {
  return {"H100 SXM + PCIe Gen5 x16", 989e12, std::size_t{80} * 1000 * 1000 * 1000, 3.35e12,
          pcie5_x16_bytes_per_second, 5e-6, true, 0.5, 0.85, "NVIDIA H100 datasheet; PCIe 5.0 base specification"};
}
//! H200 SXM 141 GB with a PCIe Gen5 x16 host link.
constexpr hardware_spec h200_sxm() {
  return {"H200 SXM + PCIe Gen5 x16", 989e12, std::size_t{141} * 1000 * 1000 * 1000, 4.8e12,
          pcie5_x16_bytes_per_second, 5e-6, true, 0.5, 0.85, "NVIDIA H200 datasheet; PCIe 5.0 base specification"};
}
//! GH200 Grace Hopper superchip (96 GB HBM3) with NVLink-C2C to Grace memory.
constexpr hardware_spec gh200() {
  return {"GH200 (NVLink-C2C)", 989e12, std::size_t{96} * 1000 * 1000 * 1000, 4.0e12, nvlink_c2c_bytes_per_second,
          2e-6, true, 0.5, 0.85, "NVIDIA GH200 Grace Hopper Superchip datasheet"};
}
//! One Blackwell GPU of a GB200 superchip with NVLink-C2C to Grace memory. The C2C link is
//! shared by the superchip's two GPUs: when both offload at once, halve `link_bytes_per_second`.
constexpr hardware_spec gb200() {
  return {"GB200 (NVLink-C2C)", 2.5e15, std::size_t{186} * 1000 * 1000 * 1000, 8.0e12, nvlink_c2c_bytes_per_second,
          2e-6, true, 0.5, 0.85, "NVIDIA GB200 NVL72 datasheet"};
}

}  // namespace hardware
}  // namespace tide
