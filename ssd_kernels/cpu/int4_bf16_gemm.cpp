// y = x @ w.T for a group-32 int4 weight (GGUF Q4_0 / Q4_1 values) and bfloat16 x, on a CPU with AVX512-BF16
// (Zen 4, Sapphire Rapids): the decode steps and verifies of a bfloat16 model with 4-bit weights. The loop over
// blocks, groups, rows and threads is bf16_dot_units.h's; this file is the int4 format.
//
// Weight layout (made by ssd_kernels/cpu/int4_bf16_gemm.py from the portable codes):
//   blocks [N / 16, K / 32, 320] uint8: for each block of 16 output features and group g of 32 input features,
//     bytes 0..255   4 chunks of 64 bytes, read as 32 16-bit words; in chunk c, word 2f + h holds in its nibble n
//                    (bits 4n .. 4n + 3) q[f, 32g + 2c + 8n + h] (q in 0..15); packed for the AMX path, word
//                    4 (f % 8) + 2h + f / 8 holds it instead (see weights())
//     bytes 256..287 the 16 features' d (fp16), bytes 288..319 their m (fp16); w = q * d + m
// Nibble n of every word, or-ed with 0x4300, is the bfloat16 number 128 + q (exponent 7, mantissa q): exact, one
// shift and one ternary-logic op per 32 codes. So per group and feature the kernel sums S = sum_k (128 + q) x[k]
// and adds d S + (m - 128 d) sum_k x[k] = sum_k (q d + m) x[k]: the algebra of dequantizing, the products exact.
// On the AMX path (group_amx_units.h) the codes are dequantized instead: w = (128 + q) d + (m - 128 d) in float32 (one
// rounding, as numpy dequantizes a GGUF, where m - 128 d is a float32 number), rounded to bfloat16.
#include "group_gemm.h"

namespace ssd_cpu {
namespace {

struct Int4Format {
  static constexpr int64_t kGroupBytes = 320, kChunks = 4, kChunkBytes = 64;
  static constexpr int kVectors = 4;
  static constexpr bool kNeedsSums = true;
  static constexpr float kBias = 128.f;       // a code q is read as the bfloat16 number 128 + q
  static constexpr int16_t kBiasBits = 0x4300;  // the bits of bfloat16 128.0

  SSD_TARGET_BF16 static inline void decode(const uint8_t* chunk, __m512bh* out) {
    const __m512i v = _mm512_loadu_si512(chunk);
    const __m512i low4 = _mm512_set1_epi16(0xF), exponent = _mm512_set1_epi16(kBiasBits);
    for (int n = 0; n < 4; ++n) {  // (v >> 4n) & 0xF | 0x4300, the and-or as one ternary-logic op
      const __m512i nibble = n == 0 ? v : _mm512_srli_epi16(v, 4 * n);
      out[n] = (__m512bh)_mm512_ternarylogic_epi32(nibble, low4, exponent, 0xEA);
    }
  }
  static constexpr int64_t input(int64_t c, int n) { return 2 * c + 8 * n; }
  // The group's bfloat16 weights as 16 tile rows (blocks packed for the AMX path): chunk c's nibble n holds pair
  // c + 4n, and its 32-bit lane j holds the codes of features j / 2 (low word) and 8 + j / 2 (high word) for input
  // 2p + j % 2, so the decoded words widened to float32 (shift, mask) are the row's halves (group_amx_units.h).
  // (128 + q) d + (m - 128 d) is w = q d + m in one rounding where m - 128 d is a float32 number (the packer checks
  // it: int4_bf16_gemm.py `tiles_exact`).
  SSD_TARGET_BF16 static inline void weights(const uint8_t* group, __m512bh* rows) {
    const uint8_t* scales = group + kChunks * kChunkBytes;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales)));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + 32)));
    const __m512 m0 = _mm512_fnmadd_ps(d, _mm512_set1_ps(kBias), m);
    const __m512 d_lo = groupamx::half_lanes(d, 0), d_hi = groupamx::half_lanes(d, 1);
    const __m512 m_lo = groupamx::half_lanes(m0, 0), m_hi = groupamx::half_lanes(m0, 1);
    const __m512i high = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
    for (int64_t c = 0; c < kChunks; ++c) {
      __m512bh codes[kVectors];
      decode(group + c * kChunkBytes, codes);
      for (int n = 0; n < kVectors; ++n) {
        const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32((__m512i)codes[n], 16));
        const __m512 hi = _mm512_castsi512_ps(_mm512_and_si512((__m512i)codes[n], high));
        rows[c + 4 * n] = _mm512_cvtne2ps_pbh(_mm512_fmadd_ps(hi, d_hi, m_hi), _mm512_fmadd_ps(lo, d_lo, m_lo));
      }
    }
  }
  SSD_TARGET_BF16 static inline __m512 epilogue(__m512 acc, __m512 dot, const uint8_t* scales, float xsum) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales)));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + 32)));
    acc = _mm512_fmadd_ps(dot, d, acc);
    return _mm512_fmadd_ps(_mm512_fnmadd_ps(d, _mm512_set1_ps(kBias), m), _mm512_set1_ps(xsum), acc);
  }
};

}  // namespace

// x [M, K] bfloat16, blocks [N / 16, K / 32, 320] uint8 -> [M, N] bfloat16, on `path` (kBf16Dot512 or kAmxBf16).
torch::Tensor int4_bf16_gemm(const torch::Tensor& x, const torch::Tensor& blocks, int64_t path) {
  return groupgemm::gemm<Int4Format>(x, blocks, path, "int4_bf16_gemm");
}

}  // namespace ssd_cpu
