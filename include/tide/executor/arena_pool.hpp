#pragma once
//! \file
//! The arena policy of every backend with real memory (host and CUDA), in one place.
//!
//! A pool hands out one block at a time, reused by every later setup that fits in it, so
//! addresses stay stable across steps. A setup that needs more gets a fresh block; the old one
//! is released at once when no executor holds it, and otherwise retired: it lives as long as the
//! executors set up on it (each holds a lease) and is freed when the last of them goes. The
//! budget bounds the bytes held at once: the current block plus retired blocks still in use.

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <tide/core/error.hpp>

namespace tide {

//! What a pool allocates with: `allocate(bytes, alignment) -> std::byte*` (nullptr or
//! `std::bad_alloc` when the memory is not there; other exceptions pass through) and
//! `deallocate(p, bytes, alignment)`, noexcept. The alignment is the schedule's (a power of two);
//! an allocator may align more.
template <class A>
concept arena_allocator = std::move_constructible<A> && requires(A& a, std::byte* p, std::size_t n) {
  { a.allocate(n, n) } -> std::same_as<std::byte*>;
  { a.deallocate(p, n, n) } noexcept;
};

//! A block from `arena_pool::reserve` and the lease that keeps it alive while held.
struct arena_block {
  std::byte* data = nullptr;               //!< the block's start, aligned as requested
  std::shared_ptr<void const> lease = {};  //!< keeps the block alive while held (see `arenas::lease`)
};

//! One lease holding both of `a` and `b` (an executor's device and host blocks).
inline std::shared_ptr<void const> joint_lease(std::shared_ptr<void const> a, std::shared_ptr<void const> b) {
  return std::make_shared<std::array<std::shared_ptr<void const>, 2> const>(
      std::array<std::shared_ptr<void const>, 2>{std::move(a), std::move(b)});
}

//! The arenas of one kind (device or host) of a backend: one block reused while setups fit in
//! it, a fresh one when not, under a budget (see the file's description).
template <arena_allocator Allocator>
class arena_pool {
 public:
  //! `name` (static storage: a literal) starts every error message, e.g. "tide: host backend
  //! device arena"; `budget` bounds the bytes held at once.
  arena_pool(char const* name, std::size_t budget, Allocator alloc = Allocator{})
      : name_(name), budget_(budget), state_(std::make_shared<state>(std::move(alloc))) {}
  arena_pool(arena_pool const&) = delete;
  arena_pool& operator=(arena_pool const&) = delete;
  //! Frees every block, leased or not: the memory goes back with its backend, as executors
  //! cannot step without it; a lease released later does nothing.
  ~arena_pool() {
    current_.reset();
    std::lock_guard lock(state_->mutex);
    for (auto const& b : state_->live) state_->alloc.deallocate(b.data, b.bytes, b.alignment);
    state_->live.clear();
    state_->held = 0;
  }

  //! A block of at least `bytes` (at least one, so that even an empty arena has an address) and
  //! its lease. Throws `out_of_memory` naming the request when it does not fit in the budget
  //! beside the blocks still in use, or when the allocator has not the memory. Not to be called
  //! concurrently with itself (leases may be released on any thread).
  //! `alignment` (a power of two) is what the block's start must be aligned to: a block of a
  //! smaller alignment is replaced like one too small.
  arena_block reserve(std::size_t bytes, std::size_t alignment = 1) {
    bytes = std::max<std::size_t>(bytes, 1);
    alignment = std::max<std::size_t>(alignment, 1);
    if (current_ && bytes <= current_->bytes && alignment <= current_->alignment) {
      peak_ = std::max(peak_, bytes);
      return {current_->data, current_};
    }
    // Leases are only made here, so a block only the pool holds stays unused meanwhile.
    bool const unused = current_ && current_.use_count() == 1;
    std::size_t const in_use = held_bytes() - (unused ? current_->bytes : 0);
    if (bytes > budget_) throw out_of_memory(name_, bytes, budget_);
    if (in_use > budget_ - bytes)
      throw out_of_memory(std::string(name_) + " (" + std::to_string(bytes) + " bytes, beside " +
                              std::to_string(in_use) + " bytes of earlier arenas that live executors still hold)",
                          in_use + bytes, budget_);
    auto old = std::move(current_);
    if (unused) old.reset();  // give its memory back before asking for more
    {
      // Room first, so that registering the block cannot fail once it is allocated.
      std::lock_guard lock(state_->mutex);
      state_->live.reserve(state_->live.size() + 1);
    }
    std::byte* p = nullptr;
    try {
      p = state_->alloc.allocate(bytes, alignment);
    } catch (std::bad_alloc const&) {
      p = nullptr;
    } catch (...) {
      current_ = std::move(old);
      throw;
    }
    if (!p) {
      current_ = std::move(old);
      throw out_of_memory(std::string(name_) + " (the allocation failed: not that much memory is free)", bytes,
                          budget_);
    }
    {
      std::lock_guard lock(state_->mutex);
      state_->live.push_back({p, bytes, alignment});
      state_->held += bytes;
    }
    try {
      current_ = std::make_shared<token>(state_, p, bytes, alignment);
    } catch (...) {
      state_->release(p);
      current_ = std::move(old);
      throw;
    }
    // `old`, when leased, is retired here: its leases keep it until the last goes.
    peak_ = std::max(peak_, bytes);
    return {p, current_};
  }

  //! Bytes allocated now: the current block plus retired blocks still leased.
  std::size_t held_bytes() const {
    std::lock_guard lock(state_->mutex);
    return state_->held;
  }
  //! Bytes of the current block (0 before the first reserve).
  std::size_t size() const noexcept { return current_ ? current_->bytes : 0; }
  //! The largest request granted.
  std::size_t peak() const noexcept { return peak_; }
  //! The bound on the bytes held at once, as given on construction.
  std::size_t budget() const noexcept { return budget_; }

 private:
  struct block {
    std::byte* data;
    std::size_t bytes, alignment;
  };
  struct state {
    explicit state(Allocator a) : alloc(std::move(a)) {}
    std::mutex mutex;
    Allocator alloc;
    std::vector<block> live;
    std::size_t held = 0;
    //! Frees `p` unless the pool already has (it frees everything when it goes).
    void release(std::byte* p) noexcept {
      std::lock_guard lock(mutex);
      auto const it = std::find_if(live.begin(), live.end(), [&](block const& b) { return b.data == p; });
      if (it == live.end()) return;
      alloc.deallocate(it->data, it->bytes, it->alignment);
      held -= it->bytes;
      live.erase(it);
    }
  };
  //! What leases share: when the last copy goes (the pool's and every executor's), the block is freed.
  struct token {
    token(std::shared_ptr<state> const& s, std::byte* d, std::size_t n, std::size_t a)
        : owner(s), data(d), bytes(n), alignment(a) {}
    token(token const&) = delete;
    token& operator=(token const&) = delete;
    ~token() {
      if (auto s = owner.lock()) s->release(data);
    }
    std::weak_ptr<state> owner;
    std::byte* data;
    std::size_t bytes, alignment;
  };

  char const* name_;
  std::size_t budget_;
  std::size_t peak_ = 0;
  std::shared_ptr<state> state_;
  std::shared_ptr<token> current_;
};

}  // namespace tide
