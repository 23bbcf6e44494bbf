// AVX-512 float32 helpers of the layer ops (layer_ops.cpp): 16 lanes loaded from float32 or bfloat16, stored back
// with bfloat16's round-to-nearest-even, and exp. Each is the same arithmetic for every lane, so a row's result
// never depends on the rows around it.
#pragma once

#include "cpu_kernels.h"

namespace ssd_cpu {

SSD_TARGET_512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
SSD_TARGET_512 inline __m512 load16(const at::BFloat16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// float32 -> bfloat16 bits in the high half of each lane, rounded to nearest even as c10::BFloat16 rounds (NaN ->
// the quiet NaN 0x7FC0).
SSD_TARGET_512 inline __m512i bf16_bits_high(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF)));
  const __m512i high = _mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(high, nan, _mm512_set1_epi32(0x7FC00000));
}

SSD_TARGET_512 inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
SSD_TARGET_512 inline void store16(at::BFloat16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_bits_high(v), 16)));
}

// v rounded to the dtype of the pointer's tensor (float32: as it is).
SSD_TARGET_512 inline __m512 round16(__m512 v, const float*) { return v; }
SSD_TARGET_512 inline __m512 round16(__m512 v, const at::BFloat16*) { return _mm512_castsi512_ps(bf16_bits_high(v)); }

// e^x within ~2 ulp: x = n ln2 + r with |r| <= ln2 / 2, e^r by its Taylor polynomial to r^7 (Horner), times 2^n.
SSD_TARGET_512 inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.8f)), _mm512_set1_ps(-104.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2 in two parts: exact n * hi
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace ssd_cpu
