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
// Offload rows rematerialize what they do not offload, as MaxText's custom remat policies do, and
// keep in the last layer what they offload elsewhere: its backward follows its forward at once,
// so those copies could hide behind nothing.

//! Offload `Names` but in the last layer (where they are kept), rematerialize the rest.
template <class Names>
using offload_but_last = tide::policy<tide::keep<Names, tide::layer_range<tide::from_end(1)>>, tide::offload<Names>, tide::remat<>>;
//! Everything a layer saves is rebuilt from its input (the carry) in backward.
using full_remat_policy = tide::policy<tide::remat<>>;
//! Llama 3.1 405B in the study: the query, key and value projections offloaded.
using llama_qkv_policy = offload_but_last<tide::slot_names<"query_proj", "key_proj", "value_proj">>;
//! DeepSeek-V3 in the study: the attention projections and the MLP up-projections offloaded, in
//! the MoE layers (routed and shared experts) and the same targets in the dense ones.
using deepseek_policy = offload_but_last<tide::slot_names<"query_proj", "key_proj", "value_proj", "mlpwi_0", "mlpwi_1",
                                                          "moe_mlpwi_0", "moe_mlpwi_1", "shared_mlpwi_0", "shared_mlpwi_1">>;
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
//! The published policies (they fit stacks of any depth).
inline std::vector<named_strategy> published_strategies() {
  return {
      {"keep-all", tide::strategy_of<>::spec()},
      {"full-remat", tide::strategy_of<full_remat_policy>::spec()},
      {"llama-qkv-naive", tide::strategy_of<llama_qkv_policy, naive, naive_buffers>::spec()},
      {"llama-qkv-lhs", tide::strategy_of<llama_qkv_policy, hiding, hiding_buffers>::spec()},
      {"deepseek-naive", tide::strategy_of<deepseek_policy, naive, naive_buffers>::spec()},
      {"deepseek-lhs", tide::strategy_of<deepseek_policy, hiding, hiding_buffers>::spec()},
      {"deepseek-lhs-pipelined", tide::strategy_of<deepseek_policy, pipelined, pipelined_buffers>::spec()},
  };
}

//! The stack's slots by `tensor_index`, resolved once (a slot no tensor names would be an error).
using slot_map = tide::slot_map<float, tensor_count>;
inline slot_map make_slot_map(tide::stack_spec const& st) {
  return slot_map(st, [](std::size_t i) { return name(static_cast<tensor>(i)); });
}

//! Trains a `model` (float) one step at a time through a tide executor: the embedding writes the
//! executor's carry input, the layers run in the executor's lambdas on tide's slots, the head and
//! the loss in the step's turn (between the last forward and the first backward), the
//! embedding's backward after the step.
class trainer {
 public:
  trainer(config c, shape s, std::uint64_t seed = 1)
      : model_(c, seed), shape_(s), grad_(s.tokens() * c.width), slots_(make_slot_map(make_stack(c, s))) {}

  model& net() noexcept { return model_; }
  shape batch_shape() const noexcept { return shape_; }

  //! One step on `ex` (whose schedule is of `make_stack(cfg, shape)`): zeroes the gradients,
  //! runs forward and backward, returns the mean loss. The optimizer step is the caller's.
  template <class Executor>
  double step(Executor& ex, std::span<std::int32_t const> tokens, std::span<std::int32_t const> targets) {
    model_.zero_gradients();
    prepare(tokens, targets);
    model_.embed(tokens, shape_, ex.template carry_input<float>());
    loss_ = 0;
    ex.step([this](auto const& ctx) { forward(ctx); }, [this](auto const& ctx) { backward(ctx); },
            tide::turn{[this](auto const& ctx) { turn(ctx); }});
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
  //! The forward lambda's body: a layer's forward, its recompute, or an advance (a forward whose
  //! slots tide lends as scratch).
  template <class Ctx>
  void forward(Ctx const& ctx) {
    auto const in = ctx.template carry_in<float>();
    if (ctx.mode == tide::forward_mode::recompute) {
      // The model's recompute takes one array: the tensors it rebuilds (where tide wants them,
      // slot()) and those it reads instead, `available` (their saved data, saved(): in a recompute
      // slot() of a tensor it does not rebuild is scratch). It never writes the latter.
      auto spans = slots_.spans(ctx);
      auto const saved = slots_.saved(ctx);
      for (std::size_t i = 0; i < tensor_count; ++i)
        if (!saved[i].empty()) spans[i] = {const_cast<float*>(saved[i].data()), saved[i].size()};
      model_.layer_recompute(ctx.layer, shape_, in, spans, slots_.produced(ctx), slots_.bound(ctx));
    } else {
      model_.layer_forward(ctx.layer, shape_, in, slots_.spans(ctx), ctx.template carry_out<float>());
    }
  }
  //! The turn's body: the head and the loss on the stack's output, seeding the gradient of the
  //! residual stream that the backward lambdas pass down.
  template <class Ctx>
  void turn(Ctx const& ctx) {
    loss_ = model_.head(ctx.template output<float>(), targets_, shape_, grad_);
  }
  //! The backward lambda's body: the layer's backward, from the gradient the turn seeded.
  template <class Ctx>
  void backward(Ctx const& ctx) {
    model_.layer_backward(ctx.layer, shape_, ctx.template carry_in<float>(), slots_.spans(ctx), grad_, grad_);
  }

 private:
  model model_;
  shape shape_;
  std::vector<float> grad_;  // the gradient of the residual stream, from the head down to the embedding
  slot_map slots_;
  std::span<std::int32_t const> tokens_, targets_;
  double loss_ = 0;
};

}  // namespace transformer
