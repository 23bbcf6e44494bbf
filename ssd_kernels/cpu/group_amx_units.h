// The AMX-BF16 loop of group-32 quantized weights (int4_bf16_gemm.cpp, q8_bf16_gemm.cpp): the same blocks and
// Formats as bf16_dot_units.h's AVX512-BF16 loop, on a CPU with AMX-BF16 (Sapphire Rapids and later), where that
// loop computes longer with every row of x and a tile product costs about the same for 1 to 16 rows.
//
// Per group of 32 inputs and block of 16 features the Format dequantizes the codes into the bfloat16 weights
// bf16(w) (w = q d + m computed in float32, then rounded to nearest even: what a bfloat16 checkpoint dequantized from
// the same codes holds) as a 16 x 64-byte B tile in L1, row p holding the 16 features' weights for inputs 2p, 2p + 1
// (AMX's pair-interleaved layout). One tdpbf16ps with x's group as the A tile (up to 16 rows, stride K) adds the
// group's products into the block's float32 C tile, which stays in its tile register over all groups: no scaling
// per group, so nothing leaves the tiles until the end. A unit of up to 4 blocks keeps its sums in tiles 0-3, x in
// tile 4 and the dequantized groups in tiles 5-7 in turn (bf16_amx.cpp's configuration). Each row runs the same tile
// products whatever the rows or threads (a tile's rows are independent), so a decode step and a verify give each
// position the same bits, and they are those of bf16_amx.cpp on the dequantized bfloat16 weight. They differ from
// the AVX512-BF16 loop's (exact products with the float32 w, scaled per group), so a model keeps one of the two for
// all rows (ssd/layers/cpu_kernels.py `quantized_bf16_path`).
//
// A Format used here also has weights(group, rows[16]): the group's bfloat16 weights as the 16 tile rows, from blocks
// packed for this path (the int4 codes' word order differs from the AVX512-BF16 loop's: int4_bf16_gemm.py).
#pragma once

#include "amx_tiles.h"
#include "bf16_dot_units.h"

namespace ssd_cpu {
namespace groupamx {

using bf16dot::kBlock;
using bf16dot::kGroup;
using bf16dot::kUnit;
using bf16dot::Operands;

using amxtiles::kTileRows;  // the most rows of x per pass (an A tile's rows)
constexpr int64_t kAhead = 2;      // groups prefetched ahead when dequantizing as the passes go

struct alignas(64) BTile {  // one dequantized group of a block: 16 rows of 32 bfloat16 weights (a vector may not be a
  __m512bh rows[16];        // std::vector's element type: GCC drops its alignment there)
};

#define SSD_TARGET_AMX_GROUPS \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,f16c,fma")))

// A Format builds tile row p (inputs 2p, 2p + 1) as two float32 vectors, lo for features 0-7 and hi for 8-15, lane j
// holding feature 8 half + j / 2's weight for input 2p + j % 2; _mm512_cvtne2ps_pbh(hi, lo) then rounds them into the
// row's pair-interleaved order with no permute. half_lanes spreads the 16 features' per-feature values (lane f) so:
// lane j of half 0 holds v[j / 2], of half 1 v[8 + j / 2]. (AVX512-BF16 only, so that the Formats inline it.)
SSD_TARGET_BF16 inline __m512 half_lanes(__m512 v, int half) {
  const __m512i lanes = half == 0 ? _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0)
                                  : _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
  return _mm512_permutexvar_ps(lanes, v);
}

#define SSD_GROUP_PRODUCT(c, b_tile, b)                          \
  if (decoded == nullptr) Format::weights(group[b], tiles[b]);   \
  _tile_loadd(b_tile, decoded ? decoded + (g * FB + b) * 16 : tiles[b], 64); \
  _tile_dpbf16ps(c, 4, b_tile);

// Rows m0 .. m0 + rows - 1 of x (the tiles configured for `rows`) times the FB blocks of the unit starting at b0,
// each group dequantized here, or read from `decoded` (decode_unit's) where it is not null.
template <class Format, int FB>
SSD_TARGET_AMX_GROUPS void unit_tiles(const Operands& o, int64_t b0, int64_t m0, int64_t rows,
                                      const __m512bh* decoded) {
  const uint8_t* unit = o.blocks + b0 * o.G * Format::kGroupBytes;  // a unit's blocks interleaved group by group
  const int64_t stride = FB * Format::kGroupBytes;                  // bytes from one group of the unit to the next
  alignas(64) __m512bh tiles[FB][16];                               // each block's dequantized group: a B tile
  _tile_zero(0);
  if (FB > 1) _tile_zero(1);
  if (FB > 2) _tile_zero(2);
  if (FB > 3) _tile_zero(3);
  for (int64_t g = 0; g < o.G; ++g) {
    const uint8_t* group[FB];
    for (int b = 0; b < FB; ++b) group[b] = unit + g * stride + b * Format::kGroupBytes;
    if (decoded == nullptr)  // the unit's group kAhead on into L1: ~10-15% at 5-16 rows (2 beat 4 and none, SPR)
      for (int64_t line = 0; line < stride; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(unit + (g + kAhead) * stride + line), _MM_HINT_T0);
    _tile_loadd(4, o.x + m0 * o.K + g * kGroup, o.K * 2);
    SSD_GROUP_PRODUCT(0, 5, 0);
    if (FB > 1) { SSD_GROUP_PRODUCT(1, 6, 1); }
    if (FB > 2) { SSD_GROUP_PRODUCT(2, 7, 2); }
    if (FB > 3) { SSD_GROUP_PRODUCT(3, 5, 3); }
  }
  amxtiles::store_unit<FB>(o.y, o.N, b0, m0, rows);
}

#undef SSD_GROUP_PRODUCT

// The FB blocks of the unit starting at b0, every group dequantized once into decoded [G][FB][16 tile rows]: for
// more rows than one tile holds (a prefill), whose passes then read the tiles as bf16_amx.cpp reads a bfloat16
// weight, with the same tile products in the same order as dequantizing in each pass (so the same bits).
template <class Format, int FB>
SSD_TARGET_AMX_GROUPS void decode_unit(const Operands& o, int64_t b0, __m512bh* decoded) {
  const uint8_t* unit = o.blocks + b0 * o.G * Format::kGroupBytes;
  for (int64_t g = 0; g < o.G; ++g)
    for (int b = 0; b < FB; ++b)
      Format::weights(unit + (g * FB + b) * Format::kGroupBytes, decoded + (g * FB + b) * 16);
}

// Every unit for every pass of up to 16 rows of x; threads split the units. Past one pass a unit's groups are
// dequantized once (into 4 KB per group, per thread: 192 KB at K = 1536) and every pass reads them.
template <class Format>
void run_units(const Operands& o, int64_t M) {
  using UnitFn = void (*)(const Operands&, int64_t, int64_t, int64_t, const __m512bh*);
  using DecodeFn = void (*)(const Operands&, int64_t, __m512bh*);
  static const UnitFn units[4] = {unit_tiles<Format, 1>, unit_tiles<Format, 2>, unit_tiles<Format, 3>,
                                  unit_tiles<Format, 4>};
  static const DecodeFn decoders[4] = {decode_unit<Format, 1>, decode_unit<Format, 2>, decode_unit<Format, 3>,
                                       decode_unit<Format, 4>};
  const int64_t num_blocks = o.N / kBlock, num_units = (num_blocks + kUnit - 1) / kUnit;
  at::parallel_for(0, num_units, 4, [&](int64_t begin, int64_t end) {
    std::vector<BTile> decoded(M > kTileRows ? o.G * kUnit : 0);
    int64_t configured = 0;  // the rows this thread's tiles are configured for
    for (int64_t u = begin; u < end; ++u) {
      const int64_t b0 = u * kUnit, fb = std::min<int64_t>(kUnit, num_blocks - b0);
      if (!decoded.empty()) decoders[fb - 1](o, b0, decoded.data()->rows);
      for (int64_t m0 = 0; m0 < M; m0 += kTileRows) {
        const int64_t rows = std::min<int64_t>(kTileRows, M - m0);
        if (rows != configured) amx_configure(configured = rows);
        units[fb - 1](o, b0, m0, rows, decoded.empty() ? nullptr : decoded.data()->rows);
      }
    }
    if (configured) amx_release();
  });
}

}  // namespace groupamx
}  // namespace ssd_cpu
