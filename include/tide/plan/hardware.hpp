#pragma once
//! \file
//! Hardware descriptions: compute throughput per data type, HBM capacity and bandwidth, the
//! host link (and how many GPUs share it), the host memory a GPU may pin, and the fabric that
//! collectives use. Presets carry public datasheet numbers (sources below); every field can be
//! overridden, and a calibrated link (`calibrate.hpp`) replaces the nominal one with measured
//! bandwidth.
//!
//! Sources (vendor datasheets and the PCI-SIG base specification):
//! - H100 SXM5: 989 TFLOP/s dense BF16, 1,979 dense FP8 (the datasheet's 1,979 and 3,958 are with
//!   sparsity), 80 GB HBM3 at 3.35 TB/s; NVLink 4 900 GB/s per GPU (both directions).
//!   NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/
//!   DGX H100: 2 TB of system memory for 8 GPUs, eight ConnectX-7 400 Gb/s ports (one per GPU).
//!   NVIDIA DGX H100 datasheet, https://www.nvidia.com/en-us/data-center/dgx-h100/
//! - H200 SXM: as H100 SXM in compute, 141 GB HBM3e at 4.8 TB/s; DGX H200: 2 TB for 8 GPUs.
//!   NVIDIA H200 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h200/
//! - PCIe Gen5 x16: 32 GT/s per lane, 16 lanes, 128b/130b encoding: 63.0 GB/s per direction.
//!   PCI Express Base Specification 5.0 (PCI-SIG, 2019).
//! - GH200 Grace Hopper: H100 GPU with 96 GB HBM3 at 4 TB/s; Grace with up to 480 GB LPDDR5X;
//!   NVLink-C2C 900 GB/s bidirectional (450 GB/s per direction) between Grace and the GPU.
//!   NVIDIA GH200 Grace Hopper Superchip datasheet, https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/
//! - GB200 NVL72 (rack of 36 Grace CPUs and 72 Blackwell GPUs): 360 PFLOP/s FP16/BF16 and
//!   720 PFLOP/s FP8 with sparsity, so per GPU 2.5 and 5 PFLOP/s dense; 13.4 TB HBM3e at
//!   576 TB/s (186 GB at 8 TB/s per GPU); up to 17 TB LPDDR5X (480 GB per Grace, shared by its
//!   two GPUs: 240 GB each); NVLink 5 130 TB/s (1.8 TB/s per GPU, both directions); NVLink-C2C
//!   900 GB/s bidirectional per superchip, shared by its two GPUs.
//!   NVIDIA GB200 NVL72 datasheet, https://www.nvidia.com/en-us/data-center/gb200-nvl72/
//!   Scale-out: 28.8 Tb/s of InfiniBand per rack, 400 Gb/s (50 GB/s) per GPU (one ConnectX-7
//!   class NIC per GPU in the MLCommons GB200 NVL72 system descriptions).
//! - Vera Rubin NVL72 (preliminary, "subject to change"): per Rubin GPU 4 PFLOP/s dense BF16 and
//!   17.5 dense FP8, 288 GB HBM4 at 22 TB/s, NVLink 6 3.6 TB/s per GPU; per superchip (one Vera,
//!   two Rubin) NVLink-C2C 1.8 TB/s and up to 1.5 TB LPDDR5X.
//!   NVIDIA Vera Rubin NVL72, https://www.nvidia.com/en-us/data-center/vera-rubin-nvl72/ and
//!   "Inside the NVIDIA Rubin Platform" (NVIDIA technical blog, 5 January 2026). Scale-out:
//!   ConnectX-9, 1.6 Tb/s per GPU (DGX Vera Rubin NVL72 page; an assumption until shipped).
//!
//! - NVLink-C2C achieved rates: on a GH200 (480 GB LPDDR5X, 96 GB HBM3, CUDA 12.4) copies reached
//!   375 GB/s host to device and 297 GB/s device to host, 0.83 and 0.66 of the 450 GB/s per
//!   direction. G. Schieffer, J. Wahlgren, J. Ren, J. Faj, I. Peng, "Harnessing Integrated
//!   CPU-GPU System Memory for HPC: a first look into Grace Hopper", arXiv:2407.07850 (2024), as
//!   reported by HPCwire. The presets with NVLink-C2C take these shares; for GB200 and Vera Rubin
//!   that is an assumption (the same link generation and DMA engines, not measured there). Other
//!   measurements differ: nvbandwidth's copy engines on 4 x GH200 gave 412-421 GB/s to the device
//!   and 170 GB/s from it (NVIDIA/Megatron-LM issue 6491, 2026), so calibrate where it matters.
//!
//! - Local NVMe (the storage tier): a DGX H100 has 8 x 3.84 TB NVMe U.2 data drives for its 8
//!   GPUs (NVIDIA DGX H100/H200 User Guide, component descriptions), one drive per GPU. The drive's
//!   rates are an assumption: a PCIe Gen4 U.2 enterprise drive such as Samsung's PM1733 is rated
//!   6.4 GB/s sequential read and 3.8 GB/s write (Samsung's announcement, as reported by
//!   Hardwareluxx, 2019); the user guide does not name the model. A GB200 NVL72 compute tray (4
//!   GPUs) has 4 E1.S NVMe drives "typically used as a fast, local cache" (NVIDIA NVL72 Enterprise
//!   Reference Architecture, components), one per GPU; their model, rates and capacity are not
//!   given: the preset takes the same drive class as an assumption. Vera Rubin: the same assumption.
//!   `calibrate_storage` measures the path on the machine at hand.
//!
//! Achieved rates are below these peaks. `mfu` (the share of peak FLOP/s a layer's matrix
//! products reach), `link_efficiency` (the share of nominal link bandwidth a pinned copy
//! reaches), `collective_efficiency` (the share of fabric bandwidth a large collective reaches)
//! and `pinnable_fraction` default to assumptions stated next to them; replace them with
//! measured values.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <tide/backends/sim/cost_table.hpp>
#include <tide/core/error.hpp>
#include <tide/core/name.hpp>
#include <tide/core/storage_link.hpp>

TIDE_DESIGNATED_INIT_BEGIN

namespace tide {

//! The data type of a model's matrix products (attention and elementwise work stay in BF16).
enum class precision : std::uint8_t { bf16, fp8 };

//! "BF16" or "FP8", as reports print it.
constexpr std::string_view to_string(precision p) noexcept { return p == precision::fp8 ? "FP8" : "BF16"; }

//! One GPU as the cost model sees it: compute, HBM, host link, host memory and fabric. The
//! presets in `tide::hardware` fill it from datasheets.
struct hardware_spec {
  tide::name name{};                 //!< what reports call this hardware
  double dense_flops = 0;            //!< peak dense BF16 FLOP/s
  double fp8_dense_flops = 0;        //!< peak dense FP8 FLOP/s (0: none; FP8 then runs at the BF16 rate)
  std::size_t hbm_bytes = 0;         //!< device memory capacity
  double hbm_bytes_per_second = 0;   //!< device memory bandwidth (elementwise ops are bound by it)
  double link_bytes_per_second = 0;  //!< nominal host link bandwidth, per direction, of the whole link
  double link_latency_us = 5;        //!< per-copy latency in microseconds (launch and DMA setup)
  bool link_full_duplex = true;      //!< both PCIe and NVLink-C2C are full duplex
  //! GPUs that share the host link and copy at once (GB200: the superchip's two GPUs run the same
  //! step, so each gets half). 1: a link of its own.
  std::uint32_t link_shared_by = 1;
  //! Host memory per GPU: the CPU's memory over the GPUs that share it (0: unknown, no cap).
  std::size_t host_bytes = 0;
  //! Share of `host_bytes` that may be pinned for offloaded data: the operating system, the
  //! framework, the data pipeline and checkpoint staging keep the rest. 0.8 is an assumption.
  double pinnable_fraction = 0.8;
  double scale_up_bytes_per_second = 0;  //!< NVLink per GPU, per direction
  std::uint32_t scale_up_gpus = 1;       //!< GPUs in one NVLink domain
  double scale_out_bytes_per_second = 0;  //!< network (InfiniBand) per GPU, per direction
  double collective_latency_us = 20;     //!< per collective, in microseconds (launch and synchronization); an assumption
  //! Share of peak FLOP/s that large BF16 matrix products and attention reach in training.
  //! 0.5 is a typical model-FLOP utilization for large dense training runs; replace with yours.
  double mfu = 0.5;
  //! Share of nominal link bandwidth a large pinned copy reaches (PCIe packet overhead and DMA
  //! efficiency), both directions unless one is set below. 0.85 is an assumption;
  //! `tide::calibrate` measures the link.
  double link_efficiency = 0.85;
  //! Share of the fabric's bandwidth a large collective reaches (NCCL bus bandwidth over link
  //! bandwidth). 0.8 is an assumption; measure it with nccl-tests.
  double collective_efficiency = 0.8;
  tide::name source{};        //!< where the numbers come from
  // Added after 0.3.0, last, so that positional initializers keep their meaning.
  double h2d_link_efficiency = 0;  //!< host to device (prefetches), in (0, 1]; 0: `link_efficiency`
  double d2h_link_efficiency = 0;  //!< device to host (offloads), in (0, 1]; 0: `link_efficiency`
  // The storage tier (spilled slots), per GPU: its share of the node's local NVMe drives.
  double storage_read_bytes_per_second = 0;   //!< sequential read (loads); 0: no storage tier
  double storage_write_bytes_per_second = 0;  //!< sequential write (stores); 0: no storage tier
  double storage_latency_us = 100;            //!< per transfer (a flash read is tens of microseconds); an assumption
  std::size_t storage_bytes = 0;              //!< capacity per GPU (0: none)

  //! The host link as the cost model uses it: achieved rates per direction, this GPU's share.
  constexpr host_link link() const noexcept {
    auto const rate = [&](double efficiency) {
      return link_bytes_per_second * (efficiency > 0 ? efficiency : link_efficiency) / (link_shared_by == 0 ? 1 : link_shared_by);
    };
    return {{rate(d2h_link_efficiency), link_latency_us}, {rate(h2d_link_efficiency), link_latency_us}, link_full_duplex};
  }
  //! The storage path as the cost model uses it: this GPU's share of the drives, each direction;
  //! a drive's reads and writes share its flash (not full duplex).
  constexpr storage_link storage() const noexcept {
    return {{storage_write_bytes_per_second, storage_latency_us}, {storage_read_bytes_per_second, storage_latency_us}, false};
  }
  //! True when the preset describes a storage tier.
  [[nodiscard]] constexpr bool has_storage() const noexcept {
    return storage_bytes > 0 && storage_read_bytes_per_second > 0 && storage_write_bytes_per_second > 0;
  }
  //! Pinned host bytes one GPU may use (no cap when `host_bytes` is unknown).
  constexpr std::size_t pinnable_host_bytes() const noexcept {
    return host_bytes == 0 ? static_cast<std::size_t>(-1) : static_cast<std::size_t>(static_cast<double>(host_bytes) * pinnable_fraction);
  }
  //! Peak dense FLOP/s of matrix products in `p`.
  constexpr double peak_flops(precision p) const noexcept {
    return p == precision::fp8 && fp8_dense_flops > 0 ? fp8_dense_flops : dense_flops;
  }
  //! Seconds for `flops` of matrix work in `p`.
  constexpr double matmul_seconds(double flops, precision p = precision::bf16) const noexcept {
    return flops / (peak_flops(p) * mfu);
  }
  //! Seconds to stream `bytes` through HBM (read plus write counted by the caller).
  constexpr double memory_seconds(double bytes) const noexcept { return bytes / hbm_bytes_per_second; }
};

//! Throws `cost_model_error` naming the field when `hw`'s link efficiencies are not shares a copy
//! can reach: `link_efficiency` in (0, 1], each direction's 0 (unset) or in (0, 1].
inline void check_link_efficiency(hardware_spec const& hw) {
  auto const check = [&](double v, char const* field, bool unset_allowed) {
    if ((unset_allowed && v == 0) || (v > 0 && v <= 1)) return;
    throw cost_model_error("tide: hardware '" + std::string(hw.name) + "' has " + field + " " + std::to_string(v) +
                           (unset_allowed ? ": give a share in (0, 1], or 0 for link_efficiency" : ": give a share in (0, 1]"));
  };
  check(hw.link_efficiency, "link_efficiency", false);
  check(hw.h2d_link_efficiency, "h2d_link_efficiency", true);
  check(hw.d2h_link_efficiency, "d2h_link_efficiency", true);
}

//! Presets with public datasheet numbers (sources in the file comment of hardware.hpp).
namespace hardware {

inline constexpr double pcie5_x16_bytes_per_second = 32e9 * 16 * 128.0 / 130.0 / 8.0;  //!< 63.0 GB/s per direction (PCIe 5.0 base spec)
inline constexpr double nvlink_c2c_bytes_per_second = 450e9;                         //!< per direction (900 GB/s bidirectional, GH200 datasheet)
inline constexpr double nvlink_c2c_h2d_efficiency = 375.0 / 450;  //!< measured on GH200 (Schieffer et al. 2024; file comment)
inline constexpr double nvlink_c2c_d2h_efficiency = 297.0 / 450;  //!< measured on GH200 (Schieffer et al. 2024; file comment)
inline constexpr std::size_t gb = std::size_t{1000} * 1000 * 1000;  //!< a decimal gigabyte, as datasheets count
inline constexpr double nvme_read_bytes_per_second = 6.4e9;   //!< one PCIe Gen4 U.2 drive (assumption: PM1733 class; file comment)
inline constexpr double nvme_write_bytes_per_second = 3.8e9;  //!< one PCIe Gen4 U.2 drive (assumption: PM1733 class; file comment)
inline constexpr std::size_t nvme_drive_bytes = 3840 * gb;     //!< a 3.84 TB drive (DGX H100 user guide)

//! `hw` with one local NVMe drive per GPU (the storage tier).
constexpr hardware_spec with_nvme_per_gpu(hardware_spec hw) {
  hw.storage_read_bytes_per_second = nvme_read_bytes_per_second;
  hw.storage_write_bytes_per_second = nvme_write_bytes_per_second;
  hw.storage_bytes = nvme_drive_bytes;
  return hw;
}

//! H100 SXM5 80 GB with a PCIe Gen5 x16 host link, in a DGX H100 (8 GPUs, 2 TB of host memory).
constexpr hardware_spec h100_sxm() {
  return with_nvme_per_gpu({.name = "H100 SXM + PCIe Gen5 x16",
          .dense_flops = 989e12,
          .fp8_dense_flops = 1979e12,
          .hbm_bytes = 80 * gb,
          .hbm_bytes_per_second = 3.35e12,
          .link_bytes_per_second = pcie5_x16_bytes_per_second,
          .host_bytes = 2000 * gb / 8,
          .scale_up_bytes_per_second = 450e9,
          .scale_up_gpus = 8,
          .scale_out_bytes_per_second = 50e9,
          .source = "NVIDIA H100 and DGX H100 datasheets; PCIe 5.0 base specification; NVMe: DGX H100 user guide, drive rates assumed (PM1733 class)"});
}
//! H200 SXM 141 GB with a PCIe Gen5 x16 host link, in a DGX H200 (8 GPUs, 2 TB of host memory).
constexpr hardware_spec h200_sxm() {
  auto h = h100_sxm();
  h.name = "H200 SXM + PCIe Gen5 x16";
  h.hbm_bytes = 141 * gb;
  h.hbm_bytes_per_second = 4.8e12;
  h.source = "NVIDIA H200 and DGX H200 datasheets; PCIe 5.0 base specification; NVMe: DGX H100/H200 user guide, drive rates assumed (PM1733 class)";
  return h;
}
//! GH200 Grace Hopper superchip (96 GB HBM3) with NVLink-C2C to its own Grace's 480 GB.
constexpr hardware_spec gh200() {
  return {.name = "GH200 (NVLink-C2C)",
          .dense_flops = 989e12,
          .fp8_dense_flops = 1979e12,
          .hbm_bytes = 96 * gb,
          .hbm_bytes_per_second = 4.0e12,
          .link_bytes_per_second = nvlink_c2c_bytes_per_second,
          .link_latency_us = 2,
          .host_bytes = 480 * gb,
          .scale_up_bytes_per_second = 450e9,
          .scale_up_gpus = 1,  // an assumption: GH200 nodes joined by the network only
          .scale_out_bytes_per_second = 50e9,
          .source = "NVIDIA GH200 Grace Hopper Superchip datasheet; NVLink-C2C rates measured on GH200 (Schieffer et al. 2024)",
          .h2d_link_efficiency = nvlink_c2c_h2d_efficiency,
          .d2h_link_efficiency = nvlink_c2c_d2h_efficiency};
}
//! One Blackwell GPU of a GB200 NVL72. The superchip's NVLink-C2C and its Grace's 480 GB are
//! shared by its two GPUs, which run the same step: each gets half the link and 240 GB.
constexpr hardware_spec gb200() {
  return with_nvme_per_gpu({.name = "GB200 NVL72 (NVLink-C2C)",
          .dense_flops = 2.5e15,
          .fp8_dense_flops = 5e15,
          .hbm_bytes = 186 * gb,
          .hbm_bytes_per_second = 8.0e12,
          .link_bytes_per_second = nvlink_c2c_bytes_per_second,
          .link_latency_us = 2,
          .link_shared_by = 2,
          .host_bytes = 240 * gb,
          .scale_up_bytes_per_second = 900e9,
          .scale_up_gpus = 72,
          .scale_out_bytes_per_second = 50e9,
          .source = "NVIDIA GB200 NVL72 datasheet; NVLink-C2C rates measured on GH200 (Schieffer et al. 2024); NVMe: NVL72 "
                    "reference architecture (one E1.S drive per GPU), drive rates and capacity assumed",
          .h2d_link_efficiency = nvlink_c2c_h2d_efficiency,
          .d2h_link_efficiency = nvlink_c2c_d2h_efficiency});
}
//! One Rubin GPU of a Vera Rubin NVL72 (preliminary figures). NVLink-C2C (1.8 TB/s both
//! directions) and the Vera CPU's 1.5 TB are shared by the superchip's two GPUs.
constexpr hardware_spec vera_rubin() {
  return with_nvme_per_gpu({.name = "Vera Rubin NVL72 (NVLink-C2C)",
          .dense_flops = 4e15,
          .fp8_dense_flops = 17.5e15,
          .hbm_bytes = 288 * gb,
          .hbm_bytes_per_second = 22e12,
          .link_bytes_per_second = 900e9,
          .link_latency_us = 2,
          .link_shared_by = 2,
          .host_bytes = 750 * gb,
          .scale_up_bytes_per_second = 1.8e12,
          .scale_up_gpus = 72,
          .scale_out_bytes_per_second = 200e9,
          .source = "NVIDIA Vera Rubin NVL72 (preliminary) and Rubin platform blog; NVLink-C2C rates measured on GH200 (Schieffer et al. 2024); "
                    "NVMe: drive class assumed",
          .h2d_link_efficiency = nvlink_c2c_h2d_efficiency,
          .d2h_link_efficiency = nvlink_c2c_d2h_efficiency});
}

}  // namespace hardware
}  // namespace tide

TIDE_DESIGNATED_INIT_END
