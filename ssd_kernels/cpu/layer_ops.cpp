// The small per-layer operations of a decoder forward, one call each instead of 3-20 torch ops: RMSNorm with the
// residual add, rotary embedding of q and k, SiLU-and-multiply, and paged attention of a few queries per sequence.
// On a small model at batch 1 the torch versions cost more in dispatch than in arithmetic (docs/benchmarks.md).
//
// float32 and bfloat16 tensors; arithmetic in float32, a bfloat16 result rounded where the torch version rounds
// (after the residual add, after the norm, the norm weight's product, the attention output). Every row (token,
// query) runs the same arithmetic whatever the batch, the number of queries or threads.
#include "cpu_kernels.h"
#include "vector512.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace ssd_cpu {
namespace {

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const at::BFloat16* p, int64_t i) { return static_cast<float>(p[i]); }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(at::BFloat16* p, int64_t i, float v) { p[i] = static_cast<at::BFloat16>(v); }
inline float round_to(float v, const float*) { return v; }
inline float round_to(float v, const at::BFloat16*) { return static_cast<float>(static_cast<at::BFloat16>(v)); }

void check_cpu(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), what, ": a contiguous CPU tensor is needed");
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, what, ": float32 or bfloat16");
}

bool all_in_range(const int64_t* values, int64_t n, int64_t bound) {  // every value in [0, bound)
  for (int64_t i = 0; i < n; ++i)
    if (values[i] < 0 || values[i] >= bound) return false;
  return true;
}

bool has_512() {  // whether the AVX-512 versions of the row loops run here
  static const bool yes = (supported_paths() & kFloat512) != 0;
  return yes;
}

// One row of rms_norm_rows, 16 lanes at a time (n a multiple of 16): the same roundings, the squares summed per lane.
template <typename T>
SSD_TARGET_512 void rms_norm_row_512(const T* x, const T* residual, const T* weight, T* out, T* sum_out, int64_t n,
                                     float eps, float* s) {
  __m512 squares = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    __m512 v = load16(x + i);
    if (residual != nullptr) {
      v = round16(_mm512_add_ps(v, load16(residual + i)), x);  // the new residual stream, in x's dtype
      store16(sum_out + i, v);
    }
    _mm512_storeu_ps(s + i, v);
    squares = _mm512_fmadd_ps(v, v, squares);
  }
  const float inv = 1.f / std::sqrt(_mm512_reduce_add_ps(squares) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; i += 16)
    store16(out + i, _mm512_mul_ps(load16(weight + i), round16(_mm512_mul_ps(_mm512_loadu_ps(s + i), _mm512_set1_ps(inv)), x)));
}

template <typename T>
void rms_norm_rows(const T* x, const T* residual, const T* weight, T* out, T* sum_out, int64_t rows, int64_t n,
                   float eps) {
  const bool wide = has_512() && n % 16 == 0;
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> s(n);
    for (int64_t r = begin; r < end; ++r) {
      const T* res = residual == nullptr ? nullptr : residual + r * n;
      T* sum_row = sum_out == nullptr ? nullptr : sum_out + r * n;
      if (wide) {
        rms_norm_row_512(x + r * n, res, weight, out + r * n, sum_row, n, eps, s.data());
        continue;
      }
      float squares = 0.f;
      for (int64_t i = 0; i < n; ++i) {
        float v = load(x, r * n + i);
        if (res != nullptr) {
          v = round_to(v + load(res, i), x);  // the new residual stream, in x's dtype
          store(sum_row, i, v);
        }
        s[i] = v;
        squares += v * v;
      }
      const float inv = 1.f / std::sqrt(squares / static_cast<float>(n) + eps);
      for (int64_t i = 0; i < n; ++i) store(out, r * n + i, load(weight, i) * round_to(s[i] * inv, x));
    }
  });
}

template <typename T>
void rope_rows(const T* x, int64_t x_stride, const int64_t* positions, const float* cos, const float* sin, T* out,
               int64_t tokens, int64_t heads, int64_t d) {
  const int64_t half = d / 2;
  at::parallel_for(0, tokens, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cos + positions[t] * d;
      const float* s = sin + positions[t] * d;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t row = (t * heads + h) * d, in = t * x_stride + h * d;
        for (int64_t i = 0; i < half; ++i) {
          const float a = load(x, in + i), b = load(x, in + half + i);
          store(out, row + i, a * c[i] - b * s[i]);  // rotate_half: (-x2, x1)
          store(out, row + half + i, b * c[half + i] + a * s[half + i]);
        }
      }
    }
  });
}

// silu(gate[i]) * up[i] for i < n - n % 16, 16 lanes at a time; returns where the scalar loop goes on.
template <typename T>
SSD_TARGET_512 int64_t silu_mul_row_512(const T* gate, const T* up, T* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = load16(gate + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = round16(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)), gate);
    store16(out + i, _mm512_mul_ps(silu, load16(up + i)));
  }
  return i;
}

template <typename T>
void silu_mul_rows(const T* x, T* out, int64_t rows, int64_t n) {
  const bool wide = has_512();
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t start = wide ? silu_mul_row_512(x + r * 2 * n, x + r * 2 * n + n, out + r * n, n) : 0;
      for (int64_t i = start; i < n; ++i) {
        const float g = load(x, r * 2 * n + i);
        const float silu = round_to(g / (1.f + std::exp(-g)), x);
        store(out, r * n + i, silu * load(x, r * 2 * n + n + i));
      }
    }
  });
}

// scores[j] = exp(scores[j] - best) for j < count; returns their sum (16 lanes, then the rest one by one).
SSD_TARGET_512 float exp_sum_512(float* scores, int64_t count, float best) {
  __m512 sum = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= count; j += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + j), _mm512_set1_ps(best)));
    _mm512_storeu_ps(scores + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  float total = _mm512_reduce_add_ps(sum);
  for (; j < count; ++j) total += (scores[j] = std::exp(scores[j] - best));
  return total;
}

float exp_sum(float* scores, int64_t count, float best) {
  if (has_512()) return exp_sum_512(scores, count, best);
  float total = 0.f;
  for (int64_t j = 0; j < count; ++j) total += (scores[j] = std::exp(scores[j] - best));
  return total;
}

// A key or value row as 8 float32 lanes, AVX2 (float32 rows as they are, bfloat16 ones widened).
SSD_TARGET_256 inline __m256 lanes(const float* p) { return _mm256_loadu_ps(p); }
SSD_TARGET_256 inline __m256 lanes(const at::BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// q . key over D (a multiple of 8) and acc += p * value: AVX2, in a fixed order (the same for every row). The
// extension serves only CPUs with AVX2 (ssd/layers/cpu_kernels.py), so attention has no other path.
template <typename T>
SSD_TARGET_256 float dot_256(const float* q, const T* key, int64_t D) {
  __m256 sum = _mm256_setzero_ps();
  for (int64_t e = 0; e < D; e += 8) sum = _mm256_fmadd_ps(_mm256_loadu_ps(q + e), lanes(key + e), sum);
  return hsum_256(sum);
}

template <typename T>
SSD_TARGET_256 void axpy_256(float p, const T* value, float* acc, int64_t D) {
  const __m256 pv = _mm256_set1_ps(p);
  for (int64_t e = 0; e < D; e += 8)
    _mm256_storeu_ps(acc + e, _mm256_fmadd_ps(pv, lanes(value + e), _mm256_loadu_ps(acc + e)));
}

// One (sequence, KV head) pair: its G query heads x Q queries against keys 0 .. seq_len - Q + i of query i.
template <typename T>
SSD_TARGET_256 void attend_group(const T* q, const T* keys, const T* values, const int64_t* slots, int64_t seq_len, T* out,
                  int64_t b, int64_t kvh, int64_t Q, int64_t H, int64_t G, int64_t D, float scale,
                  std::vector<float>& scores, std::vector<float>& acc, std::vector<float>& qf) {
  for (int64_t i = 0; i < Q; ++i) {
    const int64_t visible = seq_len - Q + i + 1;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t q_row = ((b * Q + i) * H + kvh * G + g) * D;
      for (int64_t e = 0; e < D; ++e) qf[e] = load(q, q_row + e);
      float best = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < visible; ++j) {
        const T* key = keys + slots[j] * D;
        scores[j] = dot_256(qf.data(), key, D) * scale;
        best = std::max(best, scores[j]);
      }
      const float total = exp_sum(scores.data(), visible, best);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < visible; ++j) {
        const T* value = values + slots[j] * D;
        axpy_256(scores[j] / total, value, acc.data(), D);
      }
      for (int64_t e = 0; e < D; ++e) store(out, q_row + e, acc[e]);
    }
  }
}

// The horizontal sums of 16 vectors, lane j = _mm512_reduce_add_ps(d[j]) bit for bit: the same pairs added in the
// same order (lanes i + 8, then i + 4, i + 2, i + 1), 16 keys at a time with shuffles in place of 16 reductions.
SSD_TARGET_512 inline __m512 sums_of_16(const __m512* d) {
  __m512 halves[8], quarters[4], eighths[2];
  for (int m = 0; m < 8; ++m)  // keys 2m, 2m + 1: lanes i + (i + 8) in each 256-bit half
    halves[m] = _mm512_add_ps(_mm512_shuffle_f32x4(d[2 * m], d[2 * m + 1], 0x44),
                              _mm512_shuffle_f32x4(d[2 * m], d[2 * m + 1], 0xEE));
  for (int n = 0; n < 4; ++n)  // keys 4n .. 4n + 3, one per 128-bit lane: i + (i + 4)
    quarters[n] = _mm512_add_ps(_mm512_shuffle_f32x4(halves[2 * n], halves[2 * n + 1], 0x88),
                                _mm512_shuffle_f32x4(halves[2 * n], halves[2 * n + 1], 0xDD));
  for (int r = 0; r < 2; ++r)  // 128-bit lane k: keys 8r + k (positions 0, 1) and 8r + 4 + k (2, 3): i + (i + 2)
    eighths[r] = _mm512_add_ps(_mm512_shuffle_ps(quarters[2 * r], quarters[2 * r + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_ps(quarters[2 * r], quarters[2 * r + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(eighths[0], eighths[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_ps(eighths[0], eighths[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // lane 4k + t holds key 4t + k: back to key order
  return _mm512_permutexvar_ps(_mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), sums);
}

// AVX-512, D = 16 DV: GB query heads that share one KV head (their rows of q at q_rows), one query that sees keys
// 0 .. visible - 1. Each key and value row is widened once for the GB heads, and the GB outputs stay in registers.
// Scores go 16 keys at a time (sums_of_16: the bits of one reduction per key, as the tail takes them).
// scores: [GB, S] scratch.
template <typename T, int GB, int DV>
SSD_TARGET_512 void attend_heads_512(const T* q, const int64_t* q_rows, const T* keys, const T* values,
                                     const int64_t* slots, int64_t visible, T* out, float scale, float* scores,
                                     int64_t S) {
  constexpr int64_t D = DV * 16;
  __m512 qv[GB][DV];
  float best[GB];
  __m512 bests[GB];
  for (int g = 0; g < GB; ++g) {
    for (int v = 0; v < DV; ++v) qv[g][v] = load16(q + q_rows[g] + 16 * v);
    best[g] = -std::numeric_limits<float>::infinity();
    bests[g] = _mm512_set1_ps(best[g]);
  }
  int64_t j = 0;
  alignas(64) __m512 dots[GB][16];
  for (; j + 16 <= visible; j += 16) {
    for (int k = 0; k < 16; ++k) {
      __m512 key[DV];
      for (int v = 0; v < DV; ++v) key[v] = load16(keys + slots[j + k] * D + 16 * v);
      for (int g = 0; g < GB; ++g) {
        __m512 dot = _mm512_mul_ps(qv[g][0], key[0]);
        for (int v = 1; v < DV; ++v) dot = _mm512_fmadd_ps(qv[g][v], key[v], dot);
        dots[g][k] = dot;
      }
    }
    for (int g = 0; g < GB; ++g) {
      const __m512 score = _mm512_mul_ps(sums_of_16(dots[g]), _mm512_set1_ps(scale));
      _mm512_storeu_ps(scores + g * S + j, score);
      bests[g] = _mm512_max_ps(bests[g], score);
    }
  }
  for (int g = 0; g < GB; ++g) best[g] = _mm512_reduce_max_ps(bests[g]);
  for (; j < visible; ++j) {
    __m512 key[DV];
    for (int v = 0; v < DV; ++v) key[v] = load16(keys + slots[j] * D + 16 * v);
    for (int g = 0; g < GB; ++g) {
      __m512 dot = _mm512_mul_ps(qv[g][0], key[0]);
      for (int v = 1; v < DV; ++v) dot = _mm512_fmadd_ps(qv[g][v], key[v], dot);
      const float score = _mm512_reduce_add_ps(dot) * scale;
      scores[g * S + j] = score;
      best[g] = std::max(best[g], score);
    }
  }
  for (int g = 0; g < GB; ++g) {  // the probabilities, divided 16 at a time (the same quotients)
    float* row = scores + g * S;
    const float total = exp_sum_512(row, visible, best[g]);
    int64_t i = 0;
    for (; i + 16 <= visible; i += 16)
      _mm512_storeu_ps(row + i, _mm512_div_ps(_mm512_loadu_ps(row + i), _mm512_set1_ps(total)));
    for (; i < visible; ++i) row[i] /= total;
  }
  __m512 acc[GB][DV];
  for (int g = 0; g < GB; ++g)
    for (int v = 0; v < DV; ++v) acc[g][v] = _mm512_setzero_ps();
  for (j = 0; j < visible; ++j) {
    __m512 value[DV];
    for (int v = 0; v < DV; ++v) value[v] = load16(values + slots[j] * D + 16 * v);
    for (int g = 0; g < GB; ++g) {
      const __m512 p = _mm512_set1_ps(scores[g * S + j]);
      for (int v = 0; v < DV; ++v) acc[g][v] = _mm512_fmadd_ps(p, value[v], acc[g][v]);
    }
  }
  for (int g = 0; g < GB; ++g)
    for (int v = 0; v < DV; ++v) store16(out + q_rows[g] + 16 * v, acc[g][v]);
}

// attend_group on AVX-512 for D = 64 (up to 4 heads a pass) or D = 128 (up to 2); false where it does not serve D.
template <typename T>
bool attend_group_512(const T* q, const T* keys, const T* values, const int64_t* slots, int64_t seq_len, T* out,
                      int64_t b, int64_t kvh, int64_t Q, int64_t H, int64_t G, int64_t D, float scale, float* scores,
                      int64_t S) {
  using Fn = void (*)(const T*, const int64_t*, const T*, const T*, const int64_t*, int64_t, T*, float, float*, int64_t);
  static const Fn d64[4] = {attend_heads_512<T, 1, 4>, attend_heads_512<T, 2, 4>, attend_heads_512<T, 3, 4>,
                            attend_heads_512<T, 4, 4>};
  static const Fn d128[2] = {attend_heads_512<T, 1, 8>, attend_heads_512<T, 2, 8>};
  if (!has_512() || (D != 64 && D != 128)) return false;
  const int64_t most = D == 64 ? 4 : 2;
  int64_t q_rows[4];
  for (int64_t i = 0; i < Q; ++i) {
    const int64_t visible = seq_len - Q + i + 1;
    for (int64_t g0 = 0; g0 < G; g0 += most) {
      const int64_t heads = std::min(most, G - g0);
      for (int64_t g = 0; g < heads; ++g) q_rows[g] = ((b * Q + i) * H + kvh * G + g0 + g) * D;
      (D == 64 ? d64 : d128)[heads - 1](q, q_rows, keys, values, slots, visible, out, scale, scores, S);
    }
  }
  return true;
}

// bfloat16 on AMX tiles (attention_amx.cpp), every (sequence, KV head) pair of a thread's share.
void attention_rows_amx(const at::BFloat16* q, const at::BFloat16* kv, const int64_t* kv_slots, const int64_t* seq_lens,
                        at::BFloat16* out, int64_t B, int64_t Q, int64_t H, int64_t KVH, int64_t D, int64_t num_slots,
                        int64_t S, float scale) {
  at::parallel_for(0, B * KVH, 1, [&](int64_t begin, int64_t end) {
    thread_local AmxAttentionScratch scratch;
    scratch.fit(S, D);
    amx_configure(16);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t b = w / KVH, kvh = w % KVH;
      attend_group_amx(q, kv + kvh * num_slots * D, kv + (KVH + kvh) * num_slots * D, kv_slots + b * S, seq_lens[b],
                       out, b, kvh, Q, H, H / KVH, D, scale, scratch);
    }
    amx_release();
  });
}

template <typename T>
void attention_rows(const T* q, const T* kv, const int64_t* kv_slots, const int64_t* seq_lens, T* out, int64_t B,
                    int64_t Q, int64_t H, int64_t KVH, int64_t D, int64_t num_slots, int64_t S, float scale) {
  at::parallel_for(0, B * KVH, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(4 * S), acc(D), qf(D);  // scores: up to 4 heads at once (attend_group_512)
    for (int64_t w = begin; w < end; ++w) {
      const int64_t b = w / KVH, kvh = w % KVH;
      const T* keys = kv + kvh * num_slots * D;
      const T* values = kv + (KVH + kvh) * num_slots * D;
      if (!attend_group_512<T>(q, keys, values, kv_slots + b * S, seq_lens[b], out, b, kvh, Q, H, H / KVH, D, scale,
                               scores.data(), S))
        attend_group<T>(q, keys, values, kv_slots + b * S, seq_lens[b], out, b, kvh, Q, H, H / KVH, D, scale, scores, acc, qf);
    }
  });
}

}  // namespace

std::vector<torch::Tensor> rms_norm(const torch::Tensor& x, const c10::optional<torch::Tensor>& residual,
                                    const torch::Tensor& weight, double eps) {
  check_cpu(x, "rms_norm x");
  check_cpu(weight, "rms_norm weight");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 1 && weight.size(0) == x.size(1) && weight.scalar_type() == x.scalar_type(),
              "rms_norm: x [T, n], weight [n] of x's dtype");
  torch::Tensor out = torch::empty_like(x);
  torch::Tensor sum = residual.has_value() ? torch::empty_like(x) : torch::Tensor();
  if (residual.has_value()) {
    check_cpu(*residual, "rms_norm residual");
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type(), "rms_norm: residual like x");
  }
  AT_DISPATCH_SWITCH(x.scalar_type(), "rms_norm",
      AT_DISPATCH_CASE(at::kFloat, [&] {
        rms_norm_rows<float>(x.data_ptr<float>(), residual ? residual->data_ptr<float>() : nullptr,
                             weight.data_ptr<float>(), out.data_ptr<float>(), residual ? sum.data_ptr<float>() : nullptr,
                             x.size(0), x.size(1), static_cast<float>(eps));
      })
      AT_DISPATCH_CASE(at::kBFloat16, [&] {
        using B = at::BFloat16;
        rms_norm_rows<B>(x.data_ptr<B>(), residual ? residual->data_ptr<B>() : nullptr, weight.data_ptr<B>(),
                         out.data_ptr<B>(), residual ? sum.data_ptr<B>() : nullptr, x.size(0), x.size(1),
                         static_cast<float>(eps));
      }));
  return residual.has_value() ? std::vector<torch::Tensor>{out, sum} : std::vector<torch::Tensor>{out};
}

torch::Tensor rope(const torch::Tensor& x, const torch::Tensor& positions, const torch::Tensor& cos,
                   const torch::Tensor& sin) {
  TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "rope x: a float32 or bfloat16 CPU tensor");
  TORCH_CHECK(x.dim() == 3 && x.size(2) % 2 == 0 && x.stride(2) == 1 && x.stride(1) == x.size(2),
              "rope: x [T, heads, D] with D even, each token's heads contiguous");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() && positions.numel() == x.size(0),
              "rope: positions [T] int64");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
              sin.is_contiguous() && cos.size(1) == x.size(2) && sin.sizes() == cos.sizes(), "rope: cos / sin [P, D] float32");
  TORCH_CHECK(all_in_range(positions.data_ptr<int64_t>(), positions.numel(), cos.size(0)),
              "rope: a position is outside the table");
  torch::Tensor out = torch::empty(x.sizes(), x.options());
  AT_DISPATCH_SWITCH(x.scalar_type(), "rope",
      AT_DISPATCH_CASE(at::kFloat, [&] {
        rope_rows<float>(x.data_ptr<float>(), x.stride(0), positions.data_ptr<int64_t>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                         out.data_ptr<float>(), x.size(0), x.size(1), x.size(2));
      })
      AT_DISPATCH_CASE(at::kBFloat16, [&] {
        using B = at::BFloat16;
        rope_rows<B>(x.data_ptr<B>(), x.stride(0), positions.data_ptr<int64_t>(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                     out.data_ptr<B>(), x.size(0), x.size(1), x.size(2));
      }));
  return out;
}

torch::Tensor silu_mul(const torch::Tensor& x) {
  check_cpu(x, "silu_mul x");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 2 == 0, "silu_mul: x [T, 2 I]");
  torch::Tensor out = torch::empty({x.size(0), x.size(1) / 2}, x.options());
  AT_DISPATCH_SWITCH(x.scalar_type(), "silu_mul",
      AT_DISPATCH_CASE(at::kFloat, [&] { silu_mul_rows<float>(x.data_ptr<float>(), out.data_ptr<float>(), x.size(0), x.size(1) / 2); })
      AT_DISPATCH_CASE(at::kBFloat16, [&] {
        silu_mul_rows<at::BFloat16>(x.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), x.size(0), x.size(1) / 2);
      }));
  return out;
}

// k, v [T, KVH, D] (each token's heads contiguous; rows may be strided) -> kv_cache[0 | 1, :, slots[t], :].
void store_kv(const torch::Tensor& k, const torch::Tensor& v, torch::Tensor& kv_cache, const torch::Tensor& slots) {
  check_cpu(kv_cache, "store_kv kv_cache");
  for (const torch::Tensor* t : {&k, &v})
    TORCH_CHECK(t->device().is_cpu() && t->dim() == 3 && t->scalar_type() == kv_cache.scalar_type() &&
                t->stride(2) == 1 && t->stride(1) == t->size(2) && t->sizes() == k.sizes(),
                "store_kv: k and v [T, KVH, D] of the cache's dtype, each token's heads contiguous");
  TORCH_CHECK(kv_cache.dim() == 4 && kv_cache.size(0) == 2 && kv_cache.size(1) == k.size(1) && kv_cache.size(3) == k.size(2),
              "store_kv: kv_cache [2, KVH, slots, D]");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == k.size(0),
              "store_kv: slots [T] int64");
  const int64_t T = k.size(0), KVH = k.size(1), D = k.size(2), num_slots = kv_cache.size(2);
  const int64_t* slot = slots.data_ptr<int64_t>();
  TORCH_CHECK(all_in_range(slot, T, num_slots), "store_kv: a slot is outside the cache");
  const int64_t bytes = D * kv_cache.element_size();
  char* cache = static_cast<char*>(kv_cache.data_ptr());
  const char* src[2] = {static_cast<const char*>(k.data_ptr()), static_cast<const char*>(v.data_ptr())};
  const int64_t row_stride[2] = {k.stride(0) * k.element_size(), v.stride(0) * v.element_size()};
  for (int64_t which = 0; which < 2; ++which)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < KVH; ++h)
        std::memcpy(cache + ((which * KVH + h) * num_slots + slot[t]) * bytes, src[which] + t * row_stride[which] + h * bytes,
                    bytes);
}

// q [B * Q, H, D] (Q queries per sequence, the last Q of its seq_len keys), kv_cache [2, KVH, num_slots, D] with the
// new keys stored, kv_slots [B, S] int64 (slot of each key, S >= every seq_len), seq_lens [B] int64 -> [B * Q, H, D].
torch::Tensor paged_attention(const torch::Tensor& q, const torch::Tensor& kv_cache, const torch::Tensor& kv_slots,
                              const torch::Tensor& seq_lens, int64_t num_queries, double scale, int64_t path) {
  check_cpu(q, "paged_attention q");
  check_cpu(kv_cache, "paged_attention kv_cache");
  TORCH_CHECK(q.dim() == 3 && kv_cache.dim() == 4 && kv_cache.size(0) == 2 && kv_cache.size(3) == q.size(2) &&
              kv_cache.scalar_type() == q.scalar_type() && q.size(1) % kv_cache.size(1) == 0,
              "paged_attention: q [T, H, D], kv_cache [2, KVH, slots, D] of q's dtype, H a multiple of KVH");
  TORCH_CHECK(kv_slots.scalar_type() == at::kLong && seq_lens.scalar_type() == at::kLong && kv_slots.is_contiguous() &&
              seq_lens.is_contiguous() && kv_slots.dim() == 2 && seq_lens.numel() == kv_slots.size(0),
              "paged_attention: kv_slots [B, S] and seq_lens [B] int64");
  const int64_t B = kv_slots.size(0), S = kv_slots.size(1), Q = num_queries;
  TORCH_CHECK(q.size(2) % 8 == 0 && (supported_paths() & kFloat256), "paged_attention: D a multiple of 8, AVX2");
  TORCH_CHECK(Q >= 1 && q.size(0) == B * Q, "paged_attention: q holds num_queries rows per sequence");
  const auto lens = seq_lens.accessor<int64_t, 1>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(lens[b] >= Q && lens[b] <= S, "paged_attention: every seq_len must be in [num_queries, S]");
  TORCH_CHECK(all_in_range(kv_slots.data_ptr<int64_t>(), kv_slots.numel(), kv_cache.size(2)),
              "paged_attention: a slot is outside the cache");
  TORCH_CHECK(path == 0 || path == kAmxBf16, "paged_attention: path 0 (vector loops) or ", kAmxBf16, " (AMX-BF16)");
  torch::Tensor out = torch::empty_like(q);
  const int64_t H = q.size(1), KVH = kv_cache.size(1), D = q.size(2), num_slots = kv_cache.size(2);
  if (path == kAmxBf16) {
    TORCH_CHECK(q.scalar_type() == at::kBFloat16 && (D == 64 || D == 128) && (supported_paths() & kAmxBf16),
                "paged_attention: the AMX path takes bfloat16 with head size 64 or 128, on a CPU with AMX-BF16");
    using T = at::BFloat16;
    attention_rows_amx(q.data_ptr<T>(), kv_cache.data_ptr<T>(), kv_slots.data_ptr<int64_t>(), seq_lens.data_ptr<int64_t>(),
                       out.data_ptr<T>(), B, Q, H, KVH, D, num_slots, S, static_cast<float>(scale));
    return out;
  }
  AT_DISPATCH_SWITCH(q.scalar_type(), "paged_attention",
      AT_DISPATCH_CASE(at::kFloat, [&] {
        attention_rows<float>(q.data_ptr<float>(), kv_cache.data_ptr<float>(), kv_slots.data_ptr<int64_t>(),
                              seq_lens.data_ptr<int64_t>(), out.data_ptr<float>(), B, Q, H, KVH, D, num_slots, S,
                              static_cast<float>(scale));
      })
      AT_DISPATCH_CASE(at::kBFloat16, [&] {
        using T = at::BFloat16;
        attention_rows<T>(q.data_ptr<T>(), kv_cache.data_ptr<T>(), kv_slots.data_ptr<int64_t>(), seq_lens.data_ptr<int64_t>(),
                          out.data_ptr<T>(), B, Q, H, KVH, D, num_slots, S, static_cast<float>(scale));
      }));
  return out;
}

// The attention of a Llama layer from its fused projection row: RoPE on q and k, k and v stored in their slots,
// then `paged_attention` (the same arithmetic as `rope`, `store_kv` and `paged_attention` called one by one).
// qkv [T, (H + 2 KVH) D] (rows may be strided), positions [T] int64 -> [T, H D].
torch::Tensor rope_attention(const torch::Tensor& qkv, const torch::Tensor& positions, const torch::Tensor& cos,
                             const torch::Tensor& sin, torch::Tensor& kv_cache, const torch::Tensor& slots,
                             const torch::Tensor& kv_slots, const torch::Tensor& seq_lens, int64_t num_queries,
                             int64_t num_heads, int64_t num_kv_heads, double scale, int64_t path) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.stride(1) == 1 && kv_cache.dim() == 4 &&
              qkv.size(1) == (num_heads + 2 * num_kv_heads) * kv_cache.size(3),
              "rope_attention: qkv [T, (H + 2 KVH) D], kv_cache [2, KVH, slots, D]");
  const int64_t T = qkv.size(0), D = kv_cache.size(3);
  const torch::Tensor q = qkv.narrow(1, 0, num_heads * D).view({T, num_heads, D});
  const torch::Tensor k = qkv.narrow(1, num_heads * D, num_kv_heads * D).view({T, num_kv_heads, D});
  const torch::Tensor v = qkv.narrow(1, (num_heads + num_kv_heads) * D, num_kv_heads * D).view({T, num_kv_heads, D});
  store_kv(rope(k, positions, cos, sin), v, kv_cache, slots);
  return paged_attention(rope(q, positions, cos, sin), kv_cache, kv_slots, seq_lens, num_queries, scale, path)
      .view({T, -1});
}

}  // namespace ssd_cpu
