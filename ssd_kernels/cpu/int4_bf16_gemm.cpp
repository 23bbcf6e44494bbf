// y = x @ w.T for a group-32 int4 weight (GGUF Q4_0 / Q4_1 values) and bfloat16 x, on a CPU with AVX512-BF16
// (Zen 4, Sapphire Rapids): the decode steps and verifies of a bfloat16 model with 4-bit weights.
//
// Weight layout (made by ssd_kernels/cpu/int4_bf16_gemm.py from the portable codes):
//   blocks [N / 16, K / 32, 320] uint8: for each block of 16 output features and group g of 32 input features,
//     bytes 0..255   8 chunks of 32 bytes; in chunk j, byte 2f + h holds q[f, 32g + 2j + h] in its low nibble and
//                    q[f, 32g + 2(j + 8) + h] in its high one (q in 0..15)
//     bytes 256..287 the 16 features' d (fp16), bytes 288..319 their m (fp16); w = q * d + m
// A block's group is one sequential stream. A chunk, widened to 16-bit lanes, gives by a table lookup the codes as
// exact bfloat16 numbers for two pairs of input features (2j, 2j + 1) and (2j + 16, 2j + 17), lane 2f + h for feature
// f; one vdpbf16ps with x's pair broadcast adds both products to lane f's float32 sum. So per group and feature
//   y[f] += d[f] * (sum_k q[f, k] x[k]) + m[f] * (sum_k x[k]),
// the float32 algebra of dequantizing (w = q d + m) without forming w: the products q * x are exact, as in float32.
// The 16 lanes are 16 outputs: no horizontal sums. Every output runs the same sequence of operations whatever the
// number of rows or threads (threads split units of 4 blocks), so a decode step and a verify of K + 1 positions give
// each position the same bits.
#include "cpu_kernels.h"

#include <cstring>

namespace ssd_cpu {
namespace {

constexpr int64_t kBlock = 16;        // output features per block: one float32 lane each
constexpr int64_t kUnit = 4;          // blocks per unit (threads split units)
constexpr int64_t kGroup = 32;        // input features per group (one d and m per feature)
constexpr int64_t kCodeBytes = 256;   // a block's codes of one group
constexpr int64_t kGroupBytes = 320;  // codes, then 16 d's and 16 m's (fp16)
constexpr int64_t kAhead = 6;         // groups read ahead (software prefetch)
constexpr float kBias = 128.f;        // a code q is read as the bfloat16 number 128 + q: exponent 7, mantissa q
constexpr int16_t kBiasBits = 0x4300; // the bits of bfloat16 128.0

struct Int4Bf16Operands {
  const uint8_t* blocks;  // [N / 16, G, 320]
  const uint16_t* x;      // [M, K] bfloat16
  const float* xsum;      // [M, G] float32 sums of x's groups
  uint16_t* y;            // [M, N] bfloat16
  int64_t K, N, G;
};

#define SSD_TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c,fma")))

inline int32_t pair_at(const uint16_t* x, int64_t k) {  // x[k], x[k + 1] as one 32-bit word
  int32_t pair;
  std::memcpy(&pair, x + k, 4);
  return pair;
}

// Rows m0 .. m0 + RB - 1 of x times blocks b0 .. b0 + FB - 1.
template <int RB, int FB>
SSD_TARGET_BF16 void unit_dot(const Int4Bf16Operands& o, int64_t b0, int64_t m0) {
  const __m512i low4 = _mm512_set1_epi16(0xF), exponent = _mm512_set1_epi16(kBiasBits);
  const uint8_t* w[FB];
  for (int b = 0; b < FB; ++b) w[b] = o.blocks + (b0 + b) * o.G * kGroupBytes;
  const uint16_t* x[RB];
  for (int i = 0; i < RB; ++i) x[i] = o.x + (m0 + i) * o.K;
  __m512 acc[RB][FB];
  for (int i = 0; i < RB; ++i)
    for (int b = 0; b < FB; ++b) acc[i][b] = _mm512_setzero_ps();
  for (int64_t g = 0; g < o.G; ++g) {
    __m512 dot[RB][FB];  // sum_k (128 + q[f, k]) x[k] over this group
    for (int i = 0; i < RB; ++i)
      for (int b = 0; b < FB; ++b) dot[i][b] = _mm512_setzero_ps();
    for (int64_t c = 0; c < 4; ++c) {
      __m512bh codes[FB][4];  // [block][nibble]: 128 + q as bfloat16, lane 2f + h for input 2c + 8 nibble + h
      for (int b = 0; b < FB; ++b) {
        const __m512i v = _mm512_loadu_si512(w[b] + g * kGroupBytes + c * 64);
        _mm_prefetch(reinterpret_cast<const char*>(w[b] + (g + kAhead) * kGroupBytes + c * 80), _MM_HINT_T0);
        for (int n = 0; n < 4; ++n) {  // (v >> 4n) & 0xF | 0x4300, the and-or as one ternary logic op
          const __m512i nibble = n == 0 ? v : _mm512_srli_epi16(v, 4 * n);
          codes[b][n] = (__m512bh)_mm512_ternarylogic_epi32(nibble, low4, exponent, 0xEA);
        }
      }
      for (int i = 0; i < RB; ++i)
        for (int n = 0; n < 4; ++n) {
          const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair_at(x[i], g * kGroup + 2 * c + 8 * n));
          for (int b = 0; b < FB; ++b) dot[i][b] = _mm512_dpbf16_ps(dot[i][b], codes[b][n], xv);
        }
    }
    for (int b = 0; b < FB; ++b) {  // y += d * dot + (m - 128 d) * sum(x)
      const uint8_t* scales = w[b] + g * kGroupBytes + kCodeBytes;
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales)));
      const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + 32)));
      const __m512 m_biased = _mm512_fnmadd_ps(d, _mm512_set1_ps(kBias), m);
      for (int i = 0; i < RB; ++i) {
        acc[i][b] = _mm512_fmadd_ps(dot[i][b], d, acc[i][b]);
        acc[i][b] = _mm512_fmadd_ps(m_biased, _mm512_set1_ps(o.xsum[(m0 + i) * o.G + g]), acc[i][b]);
      }
    }
  }
  for (int i = 0; i < RB; ++i)
    for (int b = 0; b < FB; ++b) {  // round to bfloat16 (nearest even, as torch rounds)
      const __m256i bits = (__m256i)_mm512_cvtneps_pbh(acc[i][b]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.y + (m0 + i) * o.N + (b0 + b) * kBlock), bits);
    }
}

using UnitFn = void (*)(const Int4Bf16Operands&, int64_t, int64_t);

// [rows - 1][blocks - 1]: passes of 1-2 rows take up to 4 blocks at once (independent sums for one row), passes of
// 3-4 rows up to 2 (the sums must fit in the 32 vector registers).
#define ROW(rb) {unit_dot<rb, 1>, unit_dot<rb, 2>, unit_dot<rb, 3>, unit_dot<rb, 4>}
const UnitFn kUnits[2][4] = {ROW(1), ROW(2)};
#undef ROW
#define ROW(rb) {unit_dot<rb, 1>, unit_dot<rb, 2>}
const UnitFn kWideUnits[2][2] = {ROW(3), ROW(4)};
#undef ROW

// Blocks b0 .. b0 + fb - 1 for every pass of up to 4 rows of x.
void run_unit(const Int4Bf16Operands& o, int64_t b0, int64_t fb, int64_t M) {
  for (int64_t m0 = 0; m0 < M; m0 += kRowsPerPass) {
    const int64_t rows = std::min<int64_t>(kRowsPerPass, M - m0);
    if (rows <= 2) {
      kUnits[rows - 1][fb - 1](o, b0, m0);
      continue;
    }
    for (int64_t b = 0; b < fb; b += 2) kWideUnits[rows - 3][std::min<int64_t>(2, fb - b) - 1](o, b0 + b, m0);
  }
}

// x [M, K] bfloat16 -> the float32 sums of its groups of 32, [M, G] (the same order for every row).
void group_sums(const uint16_t* x, int64_t M, int64_t K, float* xsum) {
  for (int64_t row = 0; row < M; ++row)
    for (int64_t g = 0; g < K / kGroup; ++g) {
      float sum = 0.f;
      for (int64_t j = 0; j < kGroup; ++j) {
        const uint32_t bits = static_cast<uint32_t>(x[row * K + g * kGroup + j]) << 16;
        float v;
        std::memcpy(&v, &bits, 4);
        sum += v;
      }
      xsum[row * (K / kGroup) + g] = sum;
    }
}

}  // namespace

// x [M, K] bfloat16, blocks [N / 16, K / 32, 320] uint8 -> [M, N] bfloat16.
torch::Tensor int4_bf16_gemm(const torch::Tensor& x, const torch::Tensor& blocks) {
  TORCH_CHECK(x.dim() == 2 && blocks.dim() == 3 && blocks.size(2) == kGroupBytes && x.size(1) % kGroup == 0 &&
                  blocks.size(1) * kGroup == x.size(1),
              "int4_bf16_gemm: x [M, K] with K a multiple of 32, blocks [N/16, K/32, 320]");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && blocks.scalar_type() == at::kByte && blocks.is_contiguous(),
              "int4_bf16_gemm: bfloat16 x and contiguous uint8 blocks");
  TORCH_CHECK(x.device().is_cpu() && blocks.device().is_cpu(), "int4_bf16_gemm: CPU tensors only");
  TORCH_CHECK(supported_paths() & kBf16Dot512, "int4_bf16_gemm: this CPU has no AVX512-BF16");
  const int64_t M = x.size(0), K = x.size(1), G = K / kGroup, N = blocks.size(0) * kBlock;
  const torch::Tensor xc = x.contiguous();
  const auto* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  torch::Tensor xsum = torch::empty({M, G}, x.options().dtype(at::kFloat));
  group_sums(xp, M, K, xsum.data_ptr<float>());
  torch::Tensor y = torch::empty({M, N}, x.options());
  const Int4Bf16Operands o{blocks.data_ptr<uint8_t>(), xp, xsum.data_ptr<float>(),
                           reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), K, N, G};
  const int64_t num_blocks = N / kBlock, num_units = (num_blocks + kUnit - 1) / kUnit;
  at::parallel_for(0, num_units, 4, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u)
      run_unit(o, u * kUnit, std::min<int64_t>(kUnit, num_blocks - u * kUnit), M);
  });
  return y;
}

}  // namespace ssd_cpu
