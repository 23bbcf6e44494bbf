// What the AMX-BF16 loops share (bf16_amx.cpp for bfloat16 weights, group_amx_units.h for quantized ones): the end
// of a unit, its float32 C tiles 0..FB-1 rounded to bfloat16 into y.
#pragma once

#include "cpu_kernels.h"

namespace ssd_cpu {
namespace amxtiles {

constexpr int64_t kBlock = 16;     // output features per block (a C tile's columns)
constexpr int64_t kUnit = 4;       // blocks per unit (C tiles 0-3)
constexpr int64_t kTileRows = 16;  // the most rows of x in one pass (an A tile's rows)

#define SSD_TARGET_AMX_TILES __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

// C tiles 0..FB-1 (`rows` x 16 float32 each: rows m0.. of the unit's blocks b0..) into y [M, N] bfloat16, rounded to
// nearest even as torch rounds.
template <int FB>
SSD_TARGET_AMX_TILES inline void store_unit(uint16_t* y, int64_t N, int64_t b0, int64_t m0, int64_t rows) {
  alignas(64) float sums[kUnit][kTileRows][kBlock];
  _tile_stored(0, sums[0], 64);
  if (FB > 1) _tile_stored(1, sums[1], 64);
  if (FB > 2) _tile_stored(2, sums[2], 64);
  if (FB > 3) _tile_stored(3, sums[3], 64);
  for (int b = 0; b < FB; ++b)
    for (int64_t i = 0; i < rows; ++i) {
      const __m256i bits = (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(sums[b][i]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + (m0 + i) * N + (b0 + b) * kBlock), bits);
    }
}

}  // namespace amxtiles
}  // namespace ssd_cpu
