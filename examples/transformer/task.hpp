#pragma once
// A synthetic task with learnable structure: n random content tokens, a separator, then the
// same tokens again (or reversed). The first half is noise and is masked out of the loss; the
// second half is predictable exactly, by attending n + 1 positions back (copy) or to the mirror
// position (reverse). A model that has not learnt it is at ~ln(vocab - 1).

#include "model.hpp"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace transformer {

struct copy_task {
  std::size_t length = 8;  //!< n content tokens; sequences have seq = 2 n positions
  std::size_t vocab = 16;  //!< token 0 is the separator, 1 .. vocab - 1 the content
  bool reverse = false;

  shape batch_shape(std::size_t batch) const { return {batch, 2 * length}; }

  //! Fills tokens and targets (-1: masked) for `batch` sequences from `r`.
  void sample(rng& r, std::size_t batch, std::vector<std::int32_t>& tokens, std::vector<std::int32_t>& targets) const {
    if (length == 0 || vocab < 2)
      throw std::invalid_argument("transformer::copy_task: needs length >= 1 and vocab >= 2");
    std::size_t const n = length, seq = 2 * n;
    tokens.assign(batch * seq, 0);
    targets.assign(batch * seq, -1);
    std::vector<std::int32_t> full(seq + 1);
    for (std::size_t b = 0; b < batch; ++b) {
      for (std::size_t i = 0; i < n; ++i) full[i] = static_cast<std::int32_t>(1 + r.below(vocab - 1));
      full[n] = 0;
      for (std::size_t i = 0; i < n; ++i) full[n + 1 + i] = full[reverse ? n - 1 - i : i];
      for (std::size_t s = 0; s < seq; ++s) {
        tokens[b * seq + s] = full[s];
        if (s >= n) targets[b * seq + s] = full[s + 1];  // only the second half is predictable
      }
    }
  }
};

}  // namespace transformer
