// y = x @ w.T for a group-32 int8 weight (GGUF Q8_0 values, w = q * d) and bfloat16 x, on a CPU with AVX512-BF16:
// the Q8_0 LM head of a bfloat16 model. The loop over blocks, groups, rows and threads is bf16_dot_units.h's; this
// file is the int8 format.
//
// Weight layout (made by ssd_kernels/cpu/q8_bf16_gemm.py from the portable codes):
//   blocks [N / 16, K / 32, 544] uint8: for each block of 16 output features and group g of 32 input features,
//     bytes 0..511   16 chunks of 32 bytes; in chunk c, byte 2f + h holds q[f, 32g + 2c + h] (int8)
//     bytes 512..543 the 16 features' d (fp16)
// A chunk's 32 codes are widened to float32 and narrowed to bfloat16, exact for |q| <= 128; per group and feature
// the kernel adds d * sum_k q x[k]: the products exact, as in float32. On the AMX path (group_amx_units.h) the
// weights are dequantized instead: q d (exact in float32), rounded to bfloat16.
#include "group_gemm.h"

namespace ssd_cpu {
namespace {

struct Q8Format {
  static constexpr int64_t kGroupBytes = 544, kChunks = 16, kChunkBytes = 32;
  static constexpr int kVectors = 1;
  static constexpr bool kNeedsSums = false;

  SSD_TARGET_BF16 static inline void decode(const uint8_t* chunk, __m512bh* out) {
    const __m512 first = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk))));
    const __m512 second =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 16))));
    out[0] = _mm512_cvtne2ps_pbh(second, first);  // lanes 0..15 from the first 16 bytes, 16..31 from the second
  }
  static constexpr int64_t input(int64_t c, int) { return 2 * c; }
  // The group's bfloat16 weights as 16 tile rows: chunk c is pair c, its first 16 bytes features 0-7 and the next
  // 16 features 8-15 (byte 2f + h), so each half widened to float32 is a row's half (group_amx_units.h).
  SSD_TARGET_BF16 static inline void weights(const uint8_t* group, __m512bh* rows) {
    const auto* scales = reinterpret_cast<const __m256i*>(group + kChunks * kChunkBytes);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(scales));
    const __m512 d_lo = groupamx::half_lanes(d, 0), d_hi = groupamx::half_lanes(d, 1);
    for (int64_t c = 0; c < kChunks; ++c) {
      const auto* chunk = reinterpret_cast<const __m128i*>(group + c * kChunkBytes);
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(chunk)));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(chunk + 1)));
      rows[c] = _mm512_cvtne2ps_pbh(_mm512_mul_ps(hi, d_hi), _mm512_mul_ps(lo, d_lo));
    }
  }
  SSD_TARGET_BF16 static inline __m512 epilogue(__m512 acc, __m512 dot, const uint8_t* scales, float) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales)));
    return _mm512_fmadd_ps(dot, d, acc);
  }
};

}  // namespace

// x [M, K] bfloat16, blocks [N / 16, K / 32, 544] uint8 -> [M, N] bfloat16, on `path` (kBf16Dot512 or kAmxBf16).
torch::Tensor q8_bf16_gemm(const torch::Tensor& x, const torch::Tensor& blocks, int64_t path) {
  return groupgemm::gemm<Q8Format>(x, blocks, path, "q8_bf16_gemm");
}

}  // namespace ssd_cpu
