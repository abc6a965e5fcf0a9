#pragma once
//! \file
//! The executor's debug checks (`executor_options::debug_checks`), run as host tasks in stream
//! order around the ops: guard bytes after each slot a lambda writes, poison over dead buffers
//! and over a carry out before its writer, and a count of each slot's prefetched chunks that its
//! readers check. A failure is recorded without allocating (on CUDA the tasks run on the
//! runtime's callback thread, where an exception would terminate) and formatted on the calling
//! thread once the step has synchronized.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <tide/core/check.hpp>
#include <tide/core/error.hpp>
#include <tide/core/schedule.hpp>
#include <tide/executor/backend.hpp>

namespace tide::detail {

//! A debug check's failure: which check, at which op, on which slot binding.
struct debug_failure {
  //! guard: bytes past a slot, its lent scratch or a carry out overwritten; prefetch: a read
  //! before its prefetch; carry: a carry out left unwritten; rebuilt: a recompute's slot or an
  //! advance's carry out that differs bitwise from what the forward wrote; unwritten: a byte of a
  //! forward's slot or carry out that differs between its two runs under two poison patterns.
  enum kind_t : std::uint8_t { none, guard, prefetch, carry, rebuilt, unwritten } kind = none;
  std::uint32_t op = 0;
  //! Index into the schedule's slot bindings, or `carry_slot` for the carry out (guard, rebuilt,
  //! unwritten)
  std::uint32_t slot = 0;
  //! guard: the overwritten guard byte; prefetch: the slot's first prefetch op; unwritten: the
  //! first byte that differs; rebuilt: the first byte of the rebuilt data still holding the
  //! rebuild's poison (when `has_detail`)
  std::size_t detail = 0;
  bool has_detail = false;  //!< rebuilt: `detail` names a byte
  //! unwritten: the byte held the first poison after the first run and the second after the
  //! second (never written); otherwise the runs wrote different data
  bool poisoned_both = false;
};

//! FNV-1a of `n` bytes at `p`: what the reproduction check compares (8 bytes kept per slot).
inline std::uint64_t bytes_hash(std::byte const* p, std::size_t n) noexcept {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<std::uint64_t>(p[i])) * 1099511628211ull;
  return h;
}

//! The checks of one executor's schedule. `attach` gives them the device arena, the executor's
//! failure flag and where to report; `before` and `after` enqueue them around op `i`.
class debug_checks {
 public:
  //! `reproduce`: also check that a recompute rebuilds its slots, and an advance its carry out,
  //! bitwise as the forward wrote them (on backends whose device memory the host can read).
  debug_checks(schedule_view s, std::byte guard_pattern, std::byte poison_pattern, bool reproduce = true)
      : s_(s), guard_(guard_pattern), poison_(poison_pattern), rebuild_poison_(~poison_pattern), reproduce_(reproduce),
        prefetched_(s.slots.size()),
        first_prefetch_(s.slots.size(), 0), forward_hash_(s.slots.size(), 0), carry_hash_(s.layers.size(), 0) {}
  debug_checks(debug_checks const&) = delete;
  debug_checks& operator=(debug_checks const&) = delete;

  //! Where the checks read and write (the device arena, host-visible on the backends that run
  //! the byte checks; the pinned host arena, whose spill ring a store leaves dead), the flag that says an op of the step failed, and the failure sink. Called
  //! once the schedule is checked (`executor_options::check_schedule`): it indexes the bindings
  //! by the ops' layers and slots.
  void attach(std::byte* device, std::byte* host, std::atomic<bool> const* failed, void* owner,
              void (*report)(void*, debug_failure)) noexcept {
    device_ = device;
    host_ = host;
    failed_ = failed;
    owner_ = owner;
    report_ = report;
    for (std::uint32_t i = static_cast<std::uint32_t>(s_.ops.size()); i-- > 0;) {
      auto const& o = s_.ops[i];
      if (o.kind == op_kind::prefetch && o.slot != carry_slot) first_prefetch_[s_.layers[o.layer].first_slot + o.slot] = i;
    }
  }
  //! A new step: no chunk prefetched yet.
  void begin_step() noexcept {
    for (auto& r : prefetched_) r.store(0, std::memory_order_relaxed);
  }

  //! The checks before op `i` (`o`) on stream `role`.
  template <class Backend>
  void before(Backend& backend, stream_role role, op const& o, std::uint32_t i) {
    if (o.kind == op_kind::backward || o.kind == op_kind::recompute) backend.host_task(role, task{&check_prefetched, this, i});
    if constexpr (Backend::device_memory_is_host_accessible) {
      // What a forward, recompute or advance writes starts as poison: a slot it leaves partly
      // unwritten compares equal between forward and recompute, and a read of lent scratch (a
      // recompute reading slot(k) for saved data) sees poison, which the reproduction check shows.
      if (is_layer_write(o.kind)) backend.host_task(role, task{&poison_written, this, i});
      if (s_.buffers.guard_bytes > 0 && is_layer_write(o.kind)) backend.host_task(role, task{&write_guards, this, i});
      if (o.kind != op_kind::backward && o.carry_out != no_carry) backend.host_task(role, task{&poison_carry_out, this, i});
    }
  }
  //! The checks after op `i` (`o`) on stream `role`.
  template <class Backend>
  void after(Backend& backend, stream_role role, op const& o, std::uint32_t i) {
    bool const carry_copy = o.slot == carry_slot;
    if (o.kind == op_kind::prefetch && !carry_copy) backend.host_task(role, task{&count_prefetch, this, i});
    if constexpr (Backend::device_memory_is_host_accessible) {
      if (s_.buffers.guard_bytes > 0 && is_layer_write(o.kind)) backend.host_task(role, task{&check_guards, this, i});
      if (o.kind != op_kind::backward && o.carry_out != no_carry) backend.host_task(role, task{&check_carry_out, this, i});
      // Before the poison below: the forward's remat slots die with it.
      if (reproduce_ && is_layer_write(o.kind)) backend.host_task(role, task{&check_reproduced, this, i});
      if (o.kind == op_kind::forward || o.kind == op_kind::backward || (o.kind == op_kind::offload && !carry_copy))
        backend.host_task(role, task{&poison, this, i});
    }
    // The spill ring's copy of a stored slot is dead until its load: a prefetch without one would
    // hand the backward the poison. Pinned host memory is host-accessible on every backend.
    // (A carry's host snapshot stays valid after its store: a reversal may prefetch from it.)
    if (o.kind == op_kind::store && !carry_copy) backend.host_task(role, task{&poison, this, i});
  }

  //! Whether `unwritten_rerun` has anything to compare (`executor_options::check_unwritten`).
  void enable_unwritten(bool on) {
    unwritten_ = on;
    if (!on) return;
    std::size_t most = 0;
    for (std::uint32_t l = 0; l < s_.layers.size(); ++l) {
      std::size_t n = s_.carry.present() ? s_.carry.bytes : 0;
      for (auto const& b : s_.slots_of(l)) n += b.bytes;
      most = n > most ? n : most;
    }
    snapshot_.resize(most);
  }
  //! After op `i` (a forward) ran once: keeps what it wrote, poisons it with the rebuild pattern,
  //! calls `again` (the same forward), and reports the first byte that differs. Runs where the
  //! forward ran, in stream order (host-accessible device memory only).
  template <class Again>
  void unwritten_rerun(std::uint32_t i, Again&& again) {
    if (!unwritten_ || failed()) return;
    auto const& o = s_.ops[i];
    auto const first = s_.layers[o.layer].first_slot;
    auto const slots = s_.slots_of(o.layer);
    auto regions = [&](auto&& f) {  // (binding index or carry_slot, where)
      for (std::uint32_t k = 0; k < slots.size(); ++k) f(first + k, device_ + slots[k].forward_offset, slots[k].bytes);
      if (o.carry_out != no_carry) f(carry_slot, device_ + o.carry_out, s_.carry.bytes);
    };
    std::size_t at = 0;
    regions([&](std::uint32_t, std::byte* p, std::size_t n) {
      std::memcpy(snapshot_.data() + at, p, n);
      std::memset(p, static_cast<int>(rebuild_poison_), n);
      at += n;
    });
    again();
    if (failed()) return;
    at = 0;
    bool reported = false;
    regions([&](std::uint32_t b, std::byte* p, std::size_t n) {
      if (reported) return;
      for (std::size_t k = 0; k < n; ++k)
        if (p[k] != snapshot_[at + k]) {
          report({.kind = debug_failure::unwritten, .op = i, .slot = b, .detail = k,
                  .poisoned_both = snapshot_[at + k] == poison_ && p[k] == rebuild_poison_});
          reported = true;
          return;
        }
      at += n;
    });
  }
  //! The stack's input (carry 0) poisoned where the user must write it before the next step.
  void poison_input() noexcept {
    // A stage's inputs are its receives' (the program writes them, the checker proves it).
    if (unwritten_ && s_.carry.present() && !s_.stage.present()) std::memset(device_ + s_.carry.input_offset(), static_cast<int>(poison_), s_.carry.bytes);
  }
  //! Throws when the stack's input still holds what `poison_input` wrote.
  void check_input() const {
    if (!unwritten_ || !s_.carry.present() || s_.stage.present()) return;
    auto const* p = device_ + s_.carry.input_offset();
    for (std::size_t k = 0; k < s_.carry.bytes; ++k)
      if (p[k] != poison_) return;
    throw debug_check_error("tide: the stack's input ('" + std::string(s_.carry.name) + "', " + std::to_string(s_.carry.bytes) +
                            " bytes) was not written before this step: every byte still holds the poison pattern " +
                            hex(poison_) + " the debug checks wrote there after the last step (executor_options::check_unwritten). "
                            "Write executor::carry_input() before each step; an input whose every byte is " + hex(poison_) +
                            " is indistinguishable: set executor_options::poison_pattern to another byte");
  }

  //! Throws the `debug_check_error` that `f` describes.
  [[noreturn]] void throw_failure(debug_failure f) const {
    auto const& o = s_.ops[f.op];
    auto const carry_name = "'" + std::string(s_.carry.name) + "', " + std::to_string(s_.carry.bytes) + " bytes";
    if (f.kind == debug_failure::carry)
      throw debug_check_error("tide: the " + std::string(to_string(o.kind)) + " lambda of layer " + std::to_string(o.layer) +
                              " (op #" + std::to_string(f.op) + ") did not write its carry out (" + carry_name +
                              "): every byte still holds the poison pattern; write ctx.carry_out() in every mode "
                              "(forward, recompute and advance)");
    auto const layer = "layer " + std::to_string(o.layer) + " (" + std::string(s_.layers[o.layer].type_name) + ")";
    auto const what = [&](std::uint32_t slot) {
      return slot == carry_slot ? "its carry out (" + carry_name + ")"
                                : "slot '" + std::string(s_.slots[slot].name) + "' (" + std::to_string(s_.slots[slot].bytes) + " bytes)";
    };
    if (f.kind == debug_failure::unwritten) {
      auto const where = "byte " + std::to_string(f.detail) + " of " + what(f.slot);
      if (f.poisoned_both)
        throw debug_check_error("tide: the forward of " + layer + " (op #" + std::to_string(f.op) + ", forward mode) left " + where +
                                " unwritten: it held the poison pattern " + hex(poison_) + " after a first run and " +
                                hex(rebuild_poison_) + " after a second (executor_options::check_unwritten). A forward must "
                                "write every byte of every slot and of its carry out: the backward would read the bytes it "
                                "leaves; declare the slot smaller if it holds less");
      throw debug_check_error("tide: the forward of " + layer + " (op #" + std::to_string(f.op) + ", forward mode) wrote " + where +
                              " differently in two runs of the same step (executor_options::check_unwritten runs each forward "
                              "twice, under two poison patterns). It reads a byte of a slot or of its carry out before "
                              "writing it, or it is not deterministic (then turn check_unwritten off)");
    }
    if (f.kind == debug_failure::rebuilt && f.slot == carry_slot)
      throw debug_check_error("tide: the advance of " + layer + " (op #" + std::to_string(f.op) + ", advance mode) wrote a carry out ('" +
                              std::string(s_.carry.name) + "') that differs bitwise from what its forward wrote: an "
                              "advance must reproduce the forward. The causes tide cannot tell apart: it read a slot "
                              "through ctx.slot(k), which in an advance is scratch tide lends (poisoned here), not data "
                              "(compute from ctx.carry_in()); it left bytes of the carry out unwritten (they hold the "
                              "poison " + hex(poison_of(op_kind::advance)) + " here, " + hex(poison_) + " in the forward); it reads state "
                              "of yours that changed since the forward (the forward and the backward must leave it as they "
                              "found it: no optimizer step, no random state advanced, no loss accumulated); or the forward "
                              "is not deterministic (then turn executor_options::check_reproduction off)");
    if (f.kind == debug_failure::rebuilt) {
      auto const& b = s_.slots[f.slot];
      throw debug_check_error(
          "tide: the recompute of " + layer + " (op #" + std::to_string(f.op) + ", recompute mode) rebuilt slot '" + std::string(b.name) +
          "' (" + std::to_string(b.bytes) + " bytes) differently from what its forward wrote: a recompute must rebuild a slot "
          "bitwise." + (f.has_detail ? " Byte " + std::to_string(f.detail) + " still holds the recompute's poison " +
                                           hex(rebuild_poison_) + ": likely left unwritten." : std::string()) +
          " The causes tide cannot tell apart: it read a slot it does not rebuild through ctx.slot(k), which in a recompute "
          "is scratch tide lends (poisoned here), not the saved data (read that with ctx.saved(k)); it left bytes of the slot "
          "unwritten (in the forward or the recompute: they hold " + hex(poison_) + " in the forward, " +
          hex(poison_of(op_kind::recompute)) + " in the recompute); it reads state of yours that changed since the forward (the forward and the backward must "
          "leave it as they found it: no optimizer step, no random state advanced, no loss accumulated); or the forward is "
          "not deterministic (then turn executor_options::check_reproduction off)");
    }
    if (f.kind == debug_failure::guard) {
      if (f.slot == carry_slot)
        throw debug_check_error("tide: the " + std::string(to_string(o.kind)) + " lambda of " + layer + " (op #" +
                                std::to_string(f.op) + ") wrote past the end of its carry out (" + carry_name +
                                (o.kind == op_kind::recompute ? ", in the scratch tide lends for it in recompute mode" : "") +
                                "): guard byte " + std::to_string(f.detail) + " was overwritten");
      auto const& b = s_.slots[f.slot];
      bool const scratch = o.kind == op_kind::advance || (o.kind == op_kind::recompute && b.where != placement::remat);
      throw debug_check_error("tide: the " + std::string(to_string(o.kind)) + " lambda of layer " + std::to_string(o.layer) +
                              " wrote past the end of slot '" + std::string(b.name) + "' (" + std::to_string(b.bytes) +
                              " bytes" + (scratch ? ", in the scratch tide lends for it in " + std::string(to_string(o.kind)) + " mode" : "") +
                              ", layer type '" + std::string(s_.layers[o.layer].type_name) + "'): guard byte " +
                              std::to_string(f.detail) + " was overwritten");
    }
    auto const& b = s_.slots[f.slot];
    throw debug_check_error("tide: op #" + std::to_string(f.op) + " (" + op_label(s_, o) + ") reads slot '" + std::string(b.name) +
                            "' whose prefetch has not completed (op #" + std::to_string(f.detail) + " prefetch, " +
                            std::to_string(s_.ops[f.detail].chunks) + " chunk(s)): the program lacks a wait on it");
  }

 private:
  bool failed() const noexcept { return failed_ && failed_->load(std::memory_order_relaxed); }
  void report(debug_failure f) const noexcept { report_(owner_, f); }
  static std::string hex(std::byte b) {
    char const* d = "0123456789ABCDEF";
    auto const v = static_cast<unsigned>(b);
    return std::string("0x") + d[v >> 4] + d[v & 15];
  }
  //! What op kind `k` poisons what it writes with: with check_unwritten, the forward one pattern
  //! and a rebuild (recompute, advance) the other, so that a byte the rebuild leaves differs from
  //! the forward's; without it the same (a slot written in part by design, read in part by its
  //! backward, stays accepted there).
  std::byte poison_of(op_kind k) const noexcept { return k == op_kind::forward || !unwritten_ ? poison_ : rebuild_poison_; }

  //! A lambda that does not write its carry out would hand the next layer stale data: poison the
  //! buffer first, and fail when every byte still holds the poison after the op.
  static void poison_carry_out(void* self, std::uint32_t i) noexcept {
    auto& e = *static_cast<debug_checks*>(self);
    if (e.failed()) return;
    std::memset(e.device_ + e.s_.ops[i].carry_out, static_cast<int>(e.poison_of(e.s_.ops[i].kind)), e.s_.carry.bytes);
  }
  static void check_carry_out(void* self, std::uint32_t i) noexcept {
    auto& e = *static_cast<debug_checks*>(self);
    if (e.failed()) return;
    auto const* p = e.device_ + e.s_.ops[i].carry_out;
    auto const poison = e.poison_of(e.s_.ops[i].kind);
    for (std::size_t k = 0; k < e.s_.carry.bytes; ++k)
      if (p[k] != poison) return;
    e.report({debug_failure::carry, i, 0, 0});
  }

  //! The ops that call the forward lambda: they write slots (or the scratch lent for them).
  static bool is_layer_write(op_kind k) noexcept {
    return k == op_kind::forward || k == op_kind::recompute || k == op_kind::advance;
  }
  //! Where op `o` lets the forward lambda write slot `b` (`slot(k)` in its mode), or `no_scratch`.
  static std::size_t written_at(op const& o, slot_binding const& b) noexcept {
    if (o.kind == op_kind::forward) return b.forward_offset;
    if (o.kind == op_kind::advance) return b.advance_offset;
    return b.where == placement::remat ? b.backward_offset : b.recompute_offset;
  }
  //! Where op `o` lets the forward lambda write a carry out (its own, or the scratch a recompute
  //! is lent), or `no_carry`.
  std::size_t carry_written_at(op const& o) const noexcept {
    if (!s_.carry.present()) return no_carry;
    if (o.kind == op_kind::recompute) return s_.recompute_carry_offset(o.layer);
    return o.carry_out;
  }
  static void poison_written(void* self, std::uint32_t i) noexcept {
    auto& e = *static_cast<debug_checks*>(self);
    if (e.failed()) return;
    auto const& o = e.s_.ops[i];
    auto const p = static_cast<int>(e.poison_of(o.kind));
    for (auto const& b : e.s_.slots_of(o.layer)) {
      // A forward's kept and offloaded slots are written in place of data nothing holds yet; its
      // remat slots and every slot of a recompute or an advance are rebuilt or scratch.
      // With check_unwritten they start as poison too: a byte the forward leaves then shows.
      if (o.kind == op_kind::forward && b.where != placement::remat && !e.unwritten_) continue;
      if (auto const at = written_at(o, b); at != slot_binding::no_scratch) std::memset(e.device_ + at, p, b.bytes);
    }
    if (o.kind == op_kind::recompute && e.s_.carry.present() && e.s_.recompute_carry_offset(o.layer) != no_carry)
      std::memset(e.device_ + e.s_.recompute_carry_offset(o.layer), p, e.s_.carry.bytes);
  }
  //! After a forward: the hashes of its remat slots and its carry out. After a recompute: its
  //! remat slots must hash as the forward's; after an advance, its carry out.
  static void check_reproduced(void* self, std::uint32_t i) noexcept {
    auto& e = *static_cast<debug_checks*>(self);
    if (e.failed()) return;
    auto const& o = e.s_.ops[i];
    auto const first = e.s_.layers[o.layer].first_slot;
    auto const slots = e.s_.slots_of(o.layer);
    if (o.kind == op_kind::forward || o.kind == op_kind::recompute) {
      for (std::uint32_t k = 0; k < slots.size(); ++k) {
        auto const& b = slots[k];
        if (b.where != placement::remat) continue;
        auto const* data = e.device_ + written_at(o, b);
        auto const h = bytes_hash(data, b.bytes);
        if (o.kind == op_kind::forward) {
          e.forward_hash_[first + k] = h;
        } else if (h != e.forward_hash_[first + k]) {
          debug_failure f{debug_failure::rebuilt, i, first + k, 0};
          for (std::size_t j = 0; e.unwritten_ && j < b.bytes && !f.has_detail; ++j)
            if (data[j] == e.rebuild_poison_) f.detail = j, f.has_detail = true;
          e.report(f);
          return;
        }
      }
    }
    if (o.carry_out == no_carry || o.kind == op_kind::recompute) return;
    auto const h = bytes_hash(e.device_ + o.carry_out, e.s_.carry.bytes);
    if (o.kind == op_kind::forward) e.carry_hash_[o.layer] = h;
    else if (h != e.carry_hash_[o.layer]) e.report({debug_failure::rebuilt, i, carry_slot, 0});
  }
  static void write_guards(void* self, std::uint32_t i) noexcept {
    auto& e = *static_cast<debug_checks*>(self);
    auto const& o = e.s_.ops[i];
    auto const g = static_cast<int>(e.guard_);
    for (auto const& b : e.s_.slots_of(o.layer))
      if (auto const at = written_at(o, b); at != slot_binding::no_scratch) std::memset(e.device_ + at + b.bytes, g, e.s_.buffers.guard_bytes);
    // A carry's region is padded by the guard bytes (core/detail/build_arena.hpp).
    if (auto const at = e.carry_written_at(o); at != no_carry) std::memset(e.device_ + at + e.s_.carry.bytes, g, e.s_.buffers.guard_bytes);
  }
  static void check_guards(void* self, std::uint32_t i) noexcept {
    auto& e = *static_cast<debug_checks*>(self);
    auto const& o = e.s_.ops[i];
    auto const intact = [&](std::size_t end, std::uint32_t slot) {
      auto const* g = e.device_ + end;
      for (std::size_t k = 0; k < e.s_.buffers.guard_bytes; ++k)
        if (g[k] != e.guard_) {
          e.report({debug_failure::guard, i, slot, k});
          return false;
        }
      return true;
    };
    for (auto const& b : e.s_.slots_of(o.layer)) {
      auto const at = written_at(o, b);
      if (at != slot_binding::no_scratch && !intact(at + b.bytes, static_cast<std::uint32_t>(&b - e.s_.slots.data()))) return;
    }
    if (auto const at = e.carry_written_at(o); at != no_carry) intact(at + e.s_.carry.bytes, carry_slot);
  }
  static void count_prefetch(void* self, std::uint32_t i) noexcept {
    auto& e = *static_cast<debug_checks*>(self);
    auto const& o = e.s_.ops[i];
    e.prefetched_[e.s_.layers[o.layer].first_slot + o.slot].fetch_add(1, std::memory_order_release);
  }
  static void check_prefetched(void* self, std::uint32_t i) noexcept {
    auto& e = *static_cast<debug_checks*>(self);
    auto const& o = e.s_.ops[i];
    auto const first = e.s_.layers[o.layer].first_slot;
    auto const slots = e.s_.slots_of(o.layer);
    for (std::uint32_t k = 0; k < slots.size(); ++k) {
      if (slots[k].where != placement::offload && slots[k].where != placement::spill) continue;
      auto const p = e.first_prefetch_[first + k];
      auto const chunks = e.s_.ops[p].chunks;
      if (e.prefetched_[first + k].load(std::memory_order_acquire) < chunks) {
        e.report({debug_failure::prefetch, i, first + k, p});
        return;
      }
    }
  }
  static void poison(void* self, std::uint32_t i) noexcept {
    auto& e = *static_cast<debug_checks*>(self);
    // After a failure (a prefetch check among them) the program may no longer be ordered: poison
    // nothing rather than race with a copy still running.
    if (e.failed()) return;
    auto const& o = e.s_.ops[i];
    auto const p = static_cast<int>(e.poison_);
    if (o.kind == op_kind::offload) {  // the source chunk is dead once copied out
      std::memset(e.device_ + o.device_offset, p, o.bytes);
      return;
    }
    if (o.kind == op_kind::store) {  // the ring's copy is dead once in the file
      std::memset(e.host_ + o.host_offset, p, o.bytes);
      return;
    }
    for (auto const& b : e.s_.slots_of(o.layer)) {
      if (o.kind == op_kind::forward && b.where == placement::remat)
        std::memset(e.device_ + b.forward_offset, p, b.bytes);  // forward scratch is dead
      if (o.kind == op_kind::backward) std::memset(e.device_ + b.backward_offset, p, b.bytes);
    }
  }

  schedule_view s_;
  std::byte guard_, poison_, rebuild_poison_;
  bool reproduce_ = true;
  bool unwritten_ = false;
  std::vector<std::atomic<std::uint32_t>> prefetched_;  // per slot binding: chunks prefetched this step
  std::vector<std::uint32_t> first_prefetch_;           // per offloaded slot binding: its first prefetch op
  std::vector<std::uint64_t> forward_hash_;             // per remat slot binding: what this step's forward wrote
  std::vector<std::uint64_t> carry_hash_;               // per layer: the carry out its forward wrote
  std::vector<std::byte> snapshot_;                     // check_unwritten: what a forward's first run wrote
  std::byte* device_ = nullptr;
  std::byte* host_ = nullptr;
  std::atomic<bool> const* failed_ = nullptr;
  void* owner_ = nullptr;
  void (*report_)(void*, debug_failure) = nullptr;
};

}  // namespace tide::detail
