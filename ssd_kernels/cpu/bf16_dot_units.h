// The loop the AVX512-BF16 kernels of group-32 quantized weights share (int4_bf16_gemm.cpp, q8_bf16_gemm.cpp), for
// bfloat16 x on Zen 4 / Sapphire Rapids.
//
// The weight is cut into blocks of 16 output features, one float32 lane each, and each block into groups of 32
// input features, Format::kGroupBytes each. Blocks come in units of 4 (the last unit may hold fewer), and a unit's
// blocks are interleaved group by group: [unit][group][block of the unit][kGroupBytes], one sequential stream per
// unit (the packers, interleave_units in ssd_kernels/cpu/bf16_units.py, lay them out so). Per group a Format decodes the block's
// codes, chunk by chunk, into vectors of 32 exact bfloat16 numbers, lane 2f + h holding feature f's code for input
// 2p + h of some pair p; one vdpbf16ps with x's pair p broadcast adds both products to lane f. After the group, the
// Format's epilogue scales that dot into the output (y[f] += d[f] * dot[f] + ...). The 16 lanes are 16 outputs: no
// horizontal sums. A unit of up to 4 blocks and up to 4 rows of x keeps its sums in registers; threads split units.
// Every output runs the same sequence of operations whatever the number of rows or threads, so a decode step and a
// verify of K + 1 positions give each position the same bits.
//
// A Format has: kGroupBytes, kChunks, kChunkBytes, kVectors (decoded vectors per chunk), kNeedsSums (whether the
// epilogue reads x's group sums), decode(chunk, out[kVectors]), input(c, n) (the first input of vector n of chunk
// c, within the group) and epilogue(acc, dot, scales, xsum) (scales: the group's bytes after the codes).
#pragma once

#include "cpu_kernels.h"

#include <cstring>

namespace ssd_cpu {
namespace bf16dot {

constexpr int64_t kBlock = 16;  // output features per block
constexpr int64_t kUnit = 4;    // blocks per unit
constexpr int64_t kGroup = 32;  // input features per group
constexpr int64_t kTallPass = 8;  // rows of x per pass over a unit
constexpr int64_t kAhead = 6;   // groups read ahead (software prefetch: the hardware's falls behind 4 streams)
// At one or two rows the loop outruns prefetches into L1 (the weight streams at ~33 GB/s into L2 against ~20 into
// L1, Zen 4, one thread); at more rows it computes longer per byte and L1 prefetches win by ~10%.

#define SSD_TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c,fma")))

struct Operands {
  const uint8_t* blocks;  // [N / 16, G, Format::kGroupBytes]
  const uint16_t* x;      // [M, K] bfloat16
  const float* xsum;      // [M, G] float32 sums of x's groups (Formats that read them)
  uint16_t* y;            // [M, N] bfloat16
  int64_t K, N, G;
  bool prefetch_to_l2;  // one or two rows of x (see kAhead)
};

inline int32_t pair_at(const uint16_t* x, int64_t k) {  // x[k], x[k + 1] as one 32-bit word
  int32_t pair;
  std::memcpy(&pair, x + k, 4);
  return pair;
}

// Rows m0 .. m0 + RB - 1 of x times blocks b0 .. b0 + FB - 1.
template <class Format, int RB, int FB>
SSD_TARGET_BF16 void unit_dot(const Operands& o, int64_t b0, int64_t m0) {
  // The unit's blocks are interleaved group by group (see the layout above): group g of its block b at
  // unit + (g * unit_blocks + b) * kGroupBytes, so the unit reads one sequential stream.
  const int64_t u0 = b0 / kUnit * kUnit, unit_blocks = std::min<int64_t>(kUnit, o.N / kBlock - u0);
  const uint8_t* unit = o.blocks + u0 * o.G * Format::kGroupBytes;
  const int64_t stride = unit_blocks * Format::kGroupBytes;  // bytes from one group of the unit to the next
  const uint8_t* w[FB];
  for (int b = 0; b < FB; ++b) w[b] = unit + (b0 - u0 + b) * Format::kGroupBytes;
  const uint16_t* x[RB];
  for (int i = 0; i < RB; ++i) x[i] = o.x + (m0 + i) * o.K;
  __m512 acc[RB][FB];
  for (int i = 0; i < RB; ++i)
    for (int b = 0; b < FB; ++b) acc[i][b] = _mm512_setzero_ps();
  for (int64_t g = 0; g < o.G; ++g) {
    for (int64_t line = 0; line < FB * Format::kGroupBytes; line += 64) {
      const char* ahead = reinterpret_cast<const char*>(w[0] + (g + kAhead) * stride + line);
      if (o.prefetch_to_l2)
        _mm_prefetch(ahead, _MM_HINT_T1);
      else
        _mm_prefetch(ahead, _MM_HINT_T0);
    }
    __m512 dot[RB][FB];  // this group's sum_k code[f, k] x[k]
    for (int i = 0; i < RB; ++i)
      for (int b = 0; b < FB; ++b) dot[i][b] = _mm512_setzero_ps();
    for (int64_t c = 0; c < Format::kChunks; ++c) {
      __m512bh codes[FB][Format::kVectors];
      for (int b = 0; b < FB; ++b) Format::decode(w[b] + g * stride + c * Format::kChunkBytes, codes[b]);
      for (int i = 0; i < RB; ++i)
        for (int n = 0; n < Format::kVectors; ++n) {
          const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair_at(x[i], g * kGroup + Format::input(c, n)));
          for (int b = 0; b < FB; ++b) dot[i][b] = _mm512_dpbf16_ps(dot[i][b], codes[b][n], xv);
        }
    }
    for (int b = 0; b < FB; ++b) {
      const uint8_t* scales = w[b] + g * stride + Format::kChunks * Format::kChunkBytes;
      for (int i = 0; i < RB; ++i) {
        const float xsum = Format::kNeedsSums ? o.xsum[(m0 + i) * o.G + g] : 0.f;
        acc[i][b] = Format::epilogue(acc[i][b], dot[i][b], scales, xsum);
      }
    }
  }
  for (int i = 0; i < RB; ++i)
    for (int b = 0; b < FB; ++b) {  // round to bfloat16 (nearest even, as torch rounds)
      const __m256i bits = (__m256i)_mm512_cvtneps_pbh(acc[i][b]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.y + (m0 + i) * o.N + (b0 + b) * kBlock), bits);
    }
}

// Every unit for every pass of up to 8 rows of x. Passes of 1-2 rows take up to 4 blocks at once (independent sums
// for one row), passes of 3-4 rows up to 2 and passes of 5-8 rows one (the sums must fit in the 32 vector
// registers): each block's codes are decoded once per pass, so a verify of K + 1 = 5..8 positions decodes them once.
template <class Format>
void run_units(const Operands& o, int64_t M) {
  using UnitFn = void (*)(const Operands&, int64_t, int64_t);
  static const UnitFn narrow[2][4] = {{unit_dot<Format, 1, 1>, unit_dot<Format, 1, 2>, unit_dot<Format, 1, 3>,
                                       unit_dot<Format, 1, 4>},
                                      {unit_dot<Format, 2, 1>, unit_dot<Format, 2, 2>, unit_dot<Format, 2, 3>,
                                       unit_dot<Format, 2, 4>}};
  static const UnitFn wide[2][2] = {{unit_dot<Format, 3, 1>, unit_dot<Format, 3, 2>},
                                    {unit_dot<Format, 4, 1>, unit_dot<Format, 4, 2>}};
  static const UnitFn tall[4] = {unit_dot<Format, 5, 1>, unit_dot<Format, 6, 1>, unit_dot<Format, 7, 1>,
                                 unit_dot<Format, 8, 1>};
  const int64_t num_blocks = o.N / kBlock, num_units = (num_blocks + kUnit - 1) / kUnit;
  at::parallel_for(0, num_units, 4, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t b0 = u * kUnit, fb = std::min<int64_t>(kUnit, num_blocks - b0);
      for (int64_t m0 = 0; m0 < M; m0 += kTallPass) {
        const int64_t rows = std::min<int64_t>(kTallPass, M - m0);
        if (rows <= 2) {
          narrow[rows - 1][fb - 1](o, b0, m0);
        } else if (rows <= 4) {
          for (int64_t b = 0; b < fb; b += 2) wide[rows - 3][std::min<int64_t>(2, fb - b) - 1](o, b0 + b, m0);
        } else {
          for (int64_t b = 0; b < fb; ++b) tall[rows - 5](o, b0 + b, m0);
        }
      }
    }
  });
}

// x [M, K] bfloat16 -> the float32 sums of its groups of 32, [M, K / 32] (the same order for every row).
inline void group_sums(const uint16_t* x, int64_t M, int64_t K, float* xsum) {
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

}  // namespace bf16dot
}  // namespace ssd_cpu
