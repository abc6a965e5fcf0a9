#pragma once
// The transformer under tide: its stack (the residual stream as the carry, every tensor a layer
// saves as a slot named as MaxText names it), the published experiment's policies as tide types,
// and a trainer whose forward and backward lambdas drive the model's layers from tide's contexts.

#include "model.hpp"

#include <tide/tide.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace transformer {

//! The tide stack of model `c` at batch shape `s`: layer types "dense" and "moe", whose slots are
//! the tensors each saves but the layer input, and the residual stream [tokens, width] as the
//! carry `decoder_layer_input`, so recomputation starts from it.
inline tide::stack_spec make_stack(config const& c, shape s) {
  validate(c);
  validate(s);
  tide::stack_spec st;
  st.carry = {"decoder_layer_input", detail::checked_mul(detail::checked_mul(s.tokens(), c.width), sizeof(float))};
  for (std::size_t l = 0; l < c.layers; ++l) {
    auto const kind = l < c.dense_layers ? layer_kind::dense : layer_kind::moe;
    tide::layer_spec t{kind == layer_kind::dense ? "dense" : "moe", {}};
    for (tensor x : layer_tensors(kind))
      if (x != tensor::decoder_layer_input) t.slots.push_back({name(x), detail::checked_mul(tensor_elements(c, x, s), sizeof(float))});
    st.append(t);
  }
  return st;
}

// ---- the published experiment's policies (MaxText's remat names), as tide types -------------
// Offload rows rematerialize what they do not offload, as MaxText's custom remat policies do.

//! Everything a layer saves is rebuilt from its input (the carry) in backward.
using full_remat_policy = tide::policy<tide::remat<>>;
//! Llama 3.1 405B in the study: the query, key and value projections offloaded.
using llama_qkv_policy =
    tide::policy<tide::offload<tide::slot_names<"query_proj", "key_proj", "value_proj">>, tide::remat<>>;
//! DeepSeek-V3 in the study: the attention projections and the MLP up-projections offloaded, in
//! the MoE layers (routed and shared experts) and the same targets in the dense ones.
using deepseek_policy = tide::policy<tide::offload<tide::slot_names<"query_proj", "key_proj", "value_proj", "mlpwi_0", "mlpwi_1",
                                                                    "moe_mlpwi_0", "moe_mlpwi_1", "shared_mlpwi_0",
                                                                    "shared_mlpwi_1">>,
                                     tide::remat<>>;
//! Copies on the compute stream, one staging buffer.
using naive = tide::pipeline<tide::latency_hiding<false>, tide::prefetch_distance<0>, tide::max_offloads_in_flight<1>>;
using naive_buffers = tide::buffers<tide::staging_buffers<1>>;
//! Latency hiding: copies on their own streams, prefetched one layer ahead.
using hiding = tide::pipeline<tide::prefetch_distance<1>>;
using hiding_buffers = tide::buffers<tide::staging_buffers<2>>;
//! Latency hiding with copies in 16 KiB chunks, prefetched two layers ahead.
using pipelined = tide::pipeline<tide::prefetch_distance<2>, tide::chunk_bytes<(16 << 10)>>;
using pipelined_buffers = tide::buffers<tide::staging_buffers<3>>;

//! A policy by the name the tables and the JSON use.
struct named_strategy {
  std::string_view name;
  tide::strategy strategy;
};
//! The published policies for a stack of `layers` layers. In the last layer the offloading ones
//! keep what they offload elsewhere (a run-time rule before the type's: the layer count is the
//! model's): its backward follows its forward at once, so those copies could hide behind nothing.
inline std::vector<named_strategy> published_strategies(std::size_t layers) {
  auto keep_last = [layers](tide::strategy s) {
    auto keep = s.policy.rules.front();  // the offload rule: its slots
    keep.where = tide::placement::keep;
    keep.first_layer = static_cast<std::uint32_t>(layers - 1);
    s.policy.rules.insert(s.policy.rules.begin(), keep);
    return s;
  };
  return {
      {"keep-all", tide::strategy_of<>::spec()},
      {"full-remat", tide::strategy_of<full_remat_policy>::spec()},
      {"llama-qkv-naive", keep_last(tide::strategy_of<llama_qkv_policy, naive, naive_buffers>::spec())},
      {"llama-qkv-lhs", keep_last(tide::strategy_of<llama_qkv_policy, hiding, hiding_buffers>::spec())},
      {"deepseek-naive", keep_last(tide::strategy_of<deepseek_policy, naive, naive_buffers>::spec())},
      {"deepseek-lhs", keep_last(tide::strategy_of<deepseek_policy, hiding, hiding_buffers>::spec())},
      {"deepseek-lhs-pipelined", keep_last(tide::strategy_of<deepseek_policy, pipelined, pipelined_buffers>::spec())},
  };
}

//! Trains a `model` (float) one step at a time through a tide executor: the embedding writes the
//! executor's carry input, the layers run in the executor's lambdas on tide's slots, the head
//! runs in the last layer's backward, the embedding's backward after the step.
class trainer {
 public:
  trainer(config c, shape s, std::uint64_t seed = 1)
      : model_(c, seed), shape_(s), grad_(s.tokens() * c.width), scratch_(tensor_count) {
    validate(s);
  }

  model& net() noexcept { return model_; }
  shape batch_shape() const noexcept { return shape_; }

  //! One step on `ex` (whose schedule is of `make_stack(cfg, shape)`): zeroes the gradients,
  //! runs forward and backward, returns the mean loss. The optimizer step is the caller's.
  template <class Executor>
  double step(Executor& ex, std::span<std::int32_t const> tokens, std::span<std::int32_t const> targets) {
    model_.zero_gradients();
    prepare(tokens, targets);
    model_.embed(tokens, shape_, floats(ex.carry_input()));
    loss_ = 0;
    auto fwd = [this](auto const& ctx) { forward(ctx); };
    auto bwd = [this](auto const& ctx) { backward(ctx); };
    ex.step(fwd, bwd);
    model_.embed_backward(tokens, shape_, grad_);
    return loss_;
  }

  //! The gradients' checksum (FNV-1a of their bytes).
  std::uint64_t gradient_checksum() const { return fnv1a(std::as_bytes(model_.gradients())); }

  //! The batch the lambdas below use (`step` sets it; a caller driving them itself, as
  //! `tide::calibrate` does, sets it first).
  void prepare(std::span<std::int32_t const> tokens, std::span<std::int32_t const> targets) {
    tokens_ = tokens;
    targets_ = targets;
  }
  //! The forward lambda's body: a layer's forward, recompute or segment recomputation.
  template <class Ctx>
  void forward(Ctx const& ctx) {
    auto const l = ctx.layer;
    if (ctx.advance) {
      auto const in = floats(ctx.carry_in());
      model_.layer_forward(l, shape_, in, scratch(l, in), floats(ctx.carry_out()));
    } else if (ctx.recompute) {
      // Rebuild the remat slots; the others hold their data (kept, or prefetched back) and are
      // read, not recomputed.
      tensor_set which, available;
      for (std::uint16_t k = 0; k < ctx.slot_count(); ++k)
        (ctx.produces(k) ? which : available).set(tensor_index(tensor_of(ctx.slot_name(k))));
      model_.layer_recompute(l, shape_, bind(ctx), which, available);
    } else {
      model_.layer_forward(l, shape_, floats(ctx.carry_in()), bind(ctx), floats(ctx.carry_out()));
    }
  }
  //! The backward lambda's body: the head in the last layer's, then the layer's backward.
  template <class Ctx>
  void backward(Ctx const& ctx) {
    auto const l = ctx.layer;
    if (l + 1 == model_.cfg().layers) loss_ = model_.head(floats(ctx.output()), targets_, shape_, grad_);
    model_.layer_backward(l, shape_, bind(ctx), grad_, grad_);
  }

 private:
  using saved_spans = model::saved_spans;

  static std::span<float> floats(std::span<std::byte> b) {
    return {reinterpret_cast<float*>(b.data()), b.size() / sizeof(float)};
  }
  static std::span<float> floats(std::span<std::byte const> b) {  // the model reads these only
    return {reinterpret_cast<float*>(const_cast<std::byte*>(b.data())), b.size() / sizeof(float)};
  }
  //! The tensor of a slot name (the stack's slots are named by `name(tensor)`).
  static tensor tensor_of(std::string_view slot) {
    for (std::size_t i = 0; i < tensor_count; ++i)
      if (name(static_cast<tensor>(i)) == slot) return static_cast<tensor>(i);
    throw std::invalid_argument("transformer: no tensor is named '" + std::string(slot) + "'");
  }
  template <class Ctx>
  saved_spans bind(Ctx const& ctx) const {
    saved_spans sv{};
    for (std::uint16_t k = 0; k < ctx.slot_count(); ++k) sv[tensor_index(tensor_of(ctx.slot_name(k)))] = floats(ctx.slot(k));
    sv[tensor_index(tensor::decoder_layer_input)] = floats(ctx.carry_in());
    return sv;
  }
  //! Somewhere for a segment recomputation (which produces the carry alone) to put the tensors
  //! the layer's forward writes.
  saved_spans scratch(std::size_t l, std::span<float> input) {
    saved_spans sv{};
    for (tensor x : layer_tensors(model_.kind(l))) {
      auto& v = scratch_[tensor_index(x)];
      v.resize(tensor_elements(model_.cfg(), x, shape_));
      sv[tensor_index(x)] = v;
    }
    sv[tensor_index(tensor::decoder_layer_input)] = input;
    return sv;
  }

  model model_;
  shape shape_;
  std::vector<float> grad_;  // the gradient of the residual stream, from the head down to the embedding
  std::vector<std::vector<float>> scratch_;
  std::span<std::int32_t const> tokens_, targets_;
  double loss_ = 0;
};

}  // namespace transformer
