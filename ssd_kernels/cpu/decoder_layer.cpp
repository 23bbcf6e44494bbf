// A whole pre-norm decoder layer of a Llama-architecture model in one call, for forwards of a few causal queries per
// sequence (decode, chain verify): RMSNorm with the residual add, the fused qkv projection, RoPE + K/V store +
// attention (rope_attention), the output projection, RMSNorm with the residual add, gate-up, SiLU-and-multiply and
// down. Each step is the function the layers call one by one (the layer ops here, the same ATen ops for the
// linears), so the result is the same bits; what the call saves is the Python and module dispatch between them,
// about half of a small model's decode step at batch 1 (docs/benchmarks.md). DecoderStack runs all of a model's
// layers in one call, as the Python loop over them would.
#include "cpu_kernels.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <string>

namespace ssd_cpu {
namespace {

// oneDNN's linear on its packed weight, as torch.ops.mkldnn._linear_pointwise(x, w, bias, "none", [], "") runs it.
torch::Tensor packed_linear(const torch::Tensor& x, const torch::Tensor& packed, const c10::optional<torch::Tensor>& bias) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack;
  stack.emplace_back(x);
  stack.emplace_back(packed);
  stack.emplace_back(bias.has_value() ? c10::IValue(*bias) : c10::IValue());
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::List<c10::optional<c10::Scalar>>());
  stack.emplace_back(std::string(""));
  op.callBoxed(&stack);
  return stack.back().toTensor();
}

}  // namespace

Linear::Linear(int64_t kind, torch::Tensor weight, c10::optional<torch::Tensor> aux, c10::optional<torch::Tensor> bias,
               int64_t param)
    : kind(kind), weight(std::move(weight)), aux(std::move(aux)), bias(std::move(bias)), param(param) {
  TORCH_CHECK(kind >= kDense && kind <= kInt4Bf16, "Linear: unknown kind ", kind);
  TORCH_CHECK(kind == kDense || kind == kPacked || kind >= kDenseOwn || this->aux.has_value(),
              "Linear: this kind needs its second tensor");
}

torch::Tensor Linear::operator()(const torch::Tensor& x) const {
  switch (kind) {
    case kDense:
      return at::linear(x, weight, bias);
    case kPacked:
      return packed_linear(x, weight, bias);
    default:
      break;
  }
  torch::Tensor y;
  if (kind == kDenseOwn) y = dense_gemm(x, weight, param);
  else if (kind == kBf16Own) y = bf16_gemm(x, weight, param);
  else if (kind == kInt4Bf16) y = int4_bf16_gemm(x, weight, param);
  else if (kind == kInt4Own) y = int4_gemm(x, weight, *aux, param);
  else if (kind == kInt4Pack) y = at::_weight_int4pack_mm_for_cpu(x, weight, param, *aux);
  else y = at::_weight_int8pack_mm(x, weight, *aux);
  return bias.has_value() ? y + *bias : y;
}

DecoderLayer::DecoderLayer(Linear qkv, Linear o, Linear gate_up, Linear down, torch::Tensor input_norm,
                           torch::Tensor post_norm, double eps, torch::Tensor cos, torch::Tensor sin, int64_t num_heads,
                           int64_t num_kv_heads, double scale, int64_t attention_path)
    : qkv(std::move(qkv)), o(std::move(o)), gate_up(std::move(gate_up)), down(std::move(down)),
      input_norm(std::move(input_norm)), post_norm(std::move(post_norm)), eps(eps), cos(std::move(cos)),
      sin(std::move(sin)), num_heads(num_heads), num_kv_heads(num_kv_heads), scale(scale),
      attention_path(attention_path) {}

// x [T, d] (the previous layer's delta, or the embeddings where residual is empty), residual [T, d] -> [this layer's
// delta, the residual stream before it], as LlamaDecoderLayer.forward returns them.
std::vector<torch::Tensor> DecoderLayer::forward(const torch::Tensor& x, const c10::optional<torch::Tensor>& residual,
                                                 const torch::Tensor& positions, torch::Tensor kv_cache,
                                                 const torch::Tensor& slots, const torch::Tensor& kv_slots,
                                                 const torch::Tensor& seq_lens, int64_t num_queries) const {
  const std::vector<torch::Tensor> normed = rms_norm(x, residual, input_norm, eps);
  const torch::Tensor stream = residual.has_value() ? normed[1] : x;
  const torch::Tensor attn = rope_attention(qkv(normed[0]), positions, cos, sin, kv_cache, slots, kv_slots, seq_lens,
                                            num_queries, num_heads, num_kv_heads, scale, attention_path);
  const std::vector<torch::Tensor> mlp_in = rms_norm(o(attn), stream, post_norm, eps);
  return {down(silu_mul(gate_up(mlp_in[0]))), mlp_in[1]};
}

DecoderStack::DecoderStack(std::vector<DecoderLayer> layers) : layers(std::move(layers)) {
  TORCH_CHECK(!this->layers.empty(), "DecoderStack: no layers");
}

// x [T, d] the embeddings -> [the last layer's delta, the residual stream before it, then the residual stream
// entering each layer of aux_layers (x + residual, as LlamaModel.forward takes it)], one kv_caches entry per layer.
std::vector<torch::Tensor> DecoderStack::forward(const torch::Tensor& x, const torch::Tensor& positions,
                                                 const std::vector<torch::Tensor>& kv_caches,
                                                 const torch::Tensor& slots, const torch::Tensor& kv_slots,
                                                 const torch::Tensor& seq_lens, int64_t num_queries,
                                                 const std::vector<int64_t>& aux_layers) const {
  TORCH_CHECK(kv_caches.size() == layers.size(), "DecoderStack: ", layers.size(), " layers, ", kv_caches.size(),
              " KV caches");
  std::vector<torch::Tensor> out(2);
  torch::Tensor delta = x;
  c10::optional<torch::Tensor> residual;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (std::find(aux_layers.begin(), aux_layers.end(), static_cast<int64_t>(i)) != aux_layers.end())
      out.push_back(residual.has_value() ? delta + *residual : delta);
    std::vector<torch::Tensor> step =
        layers[i].forward(delta, residual, positions, kv_caches[i], slots, kv_slots, seq_lens, num_queries);
    delta = std::move(step[0]);
    residual = std::move(step[1]);
  }
  out[0] = delta;
  out[1] = *residual;
  return out;
}

}  // namespace ssd_cpu
