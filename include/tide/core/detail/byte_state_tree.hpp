#pragma once
//! \file
//! The segment tree of the checker's race and data-flow sweep (core/detail/check_races.hpp): per
//! elementary byte interval, the latest writer and readers per stream and the data written.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include <tide/core/vocabulary.hpp>

namespace tide::detail {

//! Per elementary byte interval of one arena, what the sweep needs: the op that last wrote it
//! (kept per stream so that a range query yields the latest writer per stream), the latest
//! reader per stream since that write, and the data the write left there. A segment tree with
//! lazy assignment: every query and update is O(log n).
class byte_state_tree {
 public:
  struct summary {
    std::array<std::int32_t, stream_count> writer{};  //!< max over the range, -1: none
    std::array<std::int32_t, stream_count> reader{};  //!< max over the range, -1: none
    std::int32_t data_lo, data_hi;                    //!< min and max data id, -1: never written
  };

  explicit byte_state_tree(std::size_t leaves) : n_(leaves) {
    std::size_t size = 1;
    while (size < n_) size *= 2;
    sum_.assign(2 * size, empty());
    tag_.assign(2 * size, tag{});
  }

  summary query(std::size_t lo, std::size_t hi) {
    summary r = identity();
    if (lo < hi) query(1, 0, n_, lo, hi, r);
    return r;
  }
  void write(std::size_t lo, std::size_t hi, std::int32_t op, std::size_t stream, std::int32_t data) {
    tag t;
    t.assign = true;
    t.op = op;
    t.stream = static_cast<std::uint8_t>(stream);
    t.data = data;
    if (lo < hi) update(1, 0, n_, lo, hi, t);
  }
  void read(std::size_t lo, std::size_t hi, std::int32_t op, std::size_t stream) {
    tag t;
    t.reader[stream] = op;
    if (lo < hi) update(1, 0, n_, lo, hi, t);
  }

 private:
  struct tag {
    bool assign = false;  // first: the whole range was written by `op` with `data`
    std::uint8_t stream = 0;
    std::int32_t op = -1, data = -1;
    std::array<std::int32_t, stream_count> reader{-1, -1, -1, -1, -1};  // then: read by these (max)
  };
  static summary empty() {
    summary r;
    r.writer.fill(-1);
    r.reader.fill(-1);
    r.data_lo = r.data_hi = -1;
    return r;
  }
  static summary identity() {
    summary r = empty();
    r.data_lo = std::numeric_limits<std::int32_t>::max();
    r.data_hi = std::numeric_limits<std::int32_t>::min();
    return r;
  }
  static void merge(summary& into, summary const& x) {
    for (std::size_t t = 0; t < stream_count; ++t) {
      into.writer[t] = std::max(into.writer[t], x.writer[t]);
      into.reader[t] = std::max(into.reader[t], x.reader[t]);
    }
    into.data_lo = std::min(into.data_lo, x.data_lo);
    into.data_hi = std::max(into.data_hi, x.data_hi);
  }
  void apply(std::size_t node, tag const& t) {
    auto& s = sum_[node];
    auto& mine = tag_[node];
    if (t.assign) {
      s = empty();
      s.writer[t.stream] = t.op;
      s.reader = t.reader;  // a pushed tag carries the reads since its write: they stay visible
      s.data_lo = s.data_hi = t.data;
      mine = t;  // the earlier tag is overwritten, readers included
      return;
    }
    for (std::size_t k = 0; k < stream_count; ++k) {
      s.reader[k] = std::max(s.reader[k], t.reader[k]);
      mine.reader[k] = std::max(mine.reader[k], t.reader[k]);
    }
  }
  void push(std::size_t node) {
    auto const& t = tag_[node];
    if (!t.assign && t.reader == tag{}.reader) return;
    apply(2 * node, t);
    apply(2 * node + 1, t);
    tag_[node] = tag{};
  }
  void query(std::size_t node, std::size_t nl, std::size_t nr, std::size_t lo, std::size_t hi, summary& r) {
    if (lo <= nl && nr <= hi) return merge(r, sum_[node]);
    push(node);
    auto const mid = nl + (nr - nl) / 2;
    if (lo < mid) query(2 * node, nl, mid, lo, hi, r);
    if (mid < hi) query(2 * node + 1, mid, nr, lo, hi, r);
  }
  void update(std::size_t node, std::size_t nl, std::size_t nr, std::size_t lo, std::size_t hi, tag const& t) {
    if (lo <= nl && nr <= hi) return apply(node, t);
    push(node);
    auto const mid = nl + (nr - nl) / 2;
    if (lo < mid) update(2 * node, nl, mid, lo, hi, t);
    if (mid < hi) update(2 * node + 1, mid, nr, lo, hi, t);
    sum_[node] = identity();
    merge(sum_[node], sum_[2 * node]);
    merge(sum_[node], sum_[2 * node + 1]);
  }

  std::size_t n_;
  std::vector<summary> sum_;
  std::vector<tag> tag_;
};

}  // namespace tide::detail
