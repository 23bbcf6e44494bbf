// What the project's CPU kernels share: the path bits, the ISA target attributes, a horizontal sum, the tile
// loop over threads, and each kernel's entry point (bound to Python in module.cpp).
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace ssd_cpu {

constexpr int64_t kFloat256 = 1, kFloat512 = 2, kVnni512 = 4, kBf16Dot512 = 8,
                  kAmxBf16 = 16;  // the paths, as bits of supported_paths()
constexpr int64_t kTile = 4;  // output features per tile: independent accumulation chains at one row of x
constexpr int kRowsPerPass = 4;  // rows of x per pass over a tile's weights

#define SSD_TARGET_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
#define SSD_TARGET_256 __attribute__((target("avx2,f16c,fma")))

SSD_TARGET_256 inline float hsum_256(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// The paths this CPU runs, as a bit set of kFloat256 | kFloat512 | kVnni512 | kBf16Dot512 | kAmxBf16.
int64_t supported_paths();
// Whether this CPU has AMX-BF16 and the OS lets this process use its tiles (asked once, bf16_amx.cpp).
bool amx_bf16_ready();

// Runs tiles[mb - 1](operands, tile, m0) for every tile of 4 output features and every pass of up to 4 rows;
// threads split the tiles, so each row's arithmetic is the same whatever the rows or threads.
template <typename Operands>
void run_tiles(void (*const (&tiles)[4])(const Operands&, int64_t, int64_t), const Operands& o, int64_t num_tiles,
               int64_t M) {
  at::parallel_for(0, num_tiles, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t m0 = 0; m0 < M; m0 += kRowsPerPass) tiles[std::min<int64_t>(kRowsPerPass, M - m0) - 1](o, t, m0);
  });
}

torch::Tensor int4_gemm(const torch::Tensor& x, const torch::Tensor& blocks, const torch::Tensor& mins, int64_t path);
torch::Tensor q8_gemm(const torch::Tensor& x, const torch::Tensor& blocks, int64_t path);
torch::Tensor dense_gemm(const torch::Tensor& x, const torch::Tensor& weight, int64_t path);
torch::Tensor bf16_gemm(const torch::Tensor& x, const torch::Tensor& blocks, int64_t path);
// The bfloat16 GEMM's operands: x [M, K] and y [M, N] row-major, the weight in blocks [N / 16, K / 2, 32].
struct Bf16Operands {
  const uint16_t* blocks;  // [N / 16, K / 2, 32]
  const uint16_t* x;       // [M, K]
  uint16_t* y;             // [M, N] bfloat16
  int64_t K, N;
};
// Configure this thread's tiles (bf16_amx.cpp's palette: C tiles 0-3 and A tile 4 of `rows` x 64 bytes, B tiles
// 5-7 of 16 x 64 bytes), and release them when done.
void amx_configure(int64_t rows);
void amx_release();
// y = x W on AMX tiles for M rows (bf16_amx.cpp; K a multiple of 32, the CPU's tiles ready: bf16_gemm checks both).
void bf16_gemm_amx(const Bf16Operands& o, int64_t M);
torch::Tensor int4_bf16_gemm(const torch::Tensor& x, const torch::Tensor& blocks, int64_t path);
torch::Tensor q8_bf16_gemm(const torch::Tensor& x, const torch::Tensor& blocks, int64_t path);
std::vector<torch::Tensor> rms_norm(const torch::Tensor& x, const c10::optional<torch::Tensor>& residual,
                                    const torch::Tensor& weight, double eps);
torch::Tensor rope(const torch::Tensor& x, const torch::Tensor& positions, const torch::Tensor& cos,
                   const torch::Tensor& sin);
torch::Tensor silu_mul(const torch::Tensor& x);
// The first index of each row's largest float32 value, a NaN counting as the largest (row_argmax.cpp); path:
// kFloat512, kFloat256 or 0 (scalar).
torch::Tensor argmax_rows(const torch::Tensor& logits, int64_t path);
void store_kv(const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& kv_cache, const torch::Tensor& slots);
// path: 0 the vector loops (layer_ops.cpp), or kAmxBf16 (bfloat16, head size 64 or 128: attention_amx.cpp).
torch::Tensor paged_attention(const torch::Tensor& q, const torch::Tensor& kv_cache, const torch::Tensor& kv_slots,
                              const torch::Tensor& seq_lens, int64_t num_queries, double scale, int64_t path);
torch::Tensor rope_attention(const torch::Tensor& qkv, const torch::Tensor& positions, const torch::Tensor& cos,
                             const torch::Tensor& sin, torch::Tensor& kv_cache, const torch::Tensor& slots,
                             const torch::Tensor& kv_slots, const torch::Tensor& seq_lens, int64_t num_queries,
                             int64_t num_heads, int64_t num_kv_heads, double scale, int64_t path);
// A thread's scratch for attend_group_amx: scores of up to max_keys keys x 16 columns, 16 copied key rows, the
// queries' B tiles.
struct AmxAttentionScratch {
  void fit(int64_t max_keys, int64_t D);  // grow to serve max_keys keys of head size D
  std::vector<float> scores;
  std::vector<uint16_t> rows;
  std::vector<uint32_t> query_words;
};
// One (sequence b, KV head kvh) pair of paged attention on AMX tiles (attention_amx.cpp; D 64 or 128, this thread's
// tiles configured by amx_configure(16)): its G heads x Q queries against keys 0 .. seq_len - Q + i of query i.
void attend_group_amx(const at::BFloat16* q, const at::BFloat16* keys, const at::BFloat16* values,
                      const int64_t* slots, int64_t seq_len, at::BFloat16* out, int64_t b, int64_t kvh, int64_t Q,
                      int64_t H, int64_t G, int64_t D, float scale, AmxAttentionScratch& scratch);

// y = x @ W.T (+ bias) as a linear layer runs it (decoder_layer.cpp), by kind: at::linear on the weight, oneDNN's
// packed weight, the own int4 kernel (weight = blocks, aux = mins, param = path), torch's CPU int4pack kernel
// (aux = scales and zeros, param = group size), torch's int8pack kernel (aux = scales), the own float32 kernel on the
// weight (param = path), the own bfloat16 kernel (weight = its blocks, param = path) or the own int4 kernel for
// bfloat16 x (weight = its blocks, param = path).
constexpr int64_t kDense = 0, kPacked = 1, kInt4Own = 2, kInt4Pack = 3, kInt8Pack = 4, kDenseOwn = 5, kBf16Own = 6,
                  kInt4Bf16 = 7;
struct Linear {
  Linear(int64_t kind, torch::Tensor weight, c10::optional<torch::Tensor> aux, c10::optional<torch::Tensor> bias,
         int64_t param);
  torch::Tensor operator()(const torch::Tensor& x) const;
  int64_t kind;
  torch::Tensor weight;
  c10::optional<torch::Tensor> aux, bias;
  int64_t param;
};

// A pre-norm Llama decoder layer's weights, run as one call for few causal queries per sequence (decoder_layer.cpp).
struct DecoderLayer {
  DecoderLayer(Linear qkv, Linear o, Linear gate_up, Linear down, torch::Tensor input_norm, torch::Tensor post_norm,
               double eps, torch::Tensor cos, torch::Tensor sin, int64_t num_heads, int64_t num_kv_heads, double scale,
               int64_t attention_path);
  std::vector<torch::Tensor> forward(const torch::Tensor& x, const c10::optional<torch::Tensor>& residual,
                                     const torch::Tensor& positions, torch::Tensor kv_cache, const torch::Tensor& slots,
                                     const torch::Tensor& kv_slots, const torch::Tensor& seq_lens,
                                     int64_t num_queries) const;
  Linear qkv, o, gate_up, down;
  torch::Tensor input_norm, post_norm;
  double eps;
  torch::Tensor cos, sin;
  int64_t num_heads, num_kv_heads;
  double scale;
  int64_t attention_path;  // paged_attention's path
};

// A model's decoder layers in order, run as one call (decoder_layer.cpp): what the Python loop over the layers does.
struct DecoderStack {
  explicit DecoderStack(std::vector<DecoderLayer> layers);
  std::vector<torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& positions,
                                     const std::vector<torch::Tensor>& kv_caches, const torch::Tensor& slots,
                                     const torch::Tensor& kv_slots, const torch::Tensor& seq_lens, int64_t num_queries,
                                     const std::vector<int64_t>& aux_layers) const;
  std::vector<DecoderLayer> layers;
};

}  // namespace ssd_cpu
