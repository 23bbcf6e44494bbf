// y = x @ w.T for a bfloat16 weight in the kernel's block layout, bfloat16 x, on a CPU with AVX512-BF16 (Zen 4,
// Sapphire Rapids): the decode steps and verifies of a bfloat16 model.
//
// Weight layout (made by ssd_kernels/cpu/bf16_gemm.py from the checkpoint's [N, K] weight):
//   blocks [N / 16, K / 2, 32] bfloat16: for each block of 16 output features and pair of input features (2p, 2p + 1),
//          the 16 features' two weights, feature-major: one 64-byte vector, lane f = (w[f, 2p], w[f, 2p + 1]).
// A block is one sequential stream. Each vdpbf16ps multiplies a block's vector with x's pair (2p, 2p + 1) broadcast
// to every lane and adds both products to lane f's float32 sum, so the 16 lanes end up as 16 outputs with no
// horizontal sums. A unit of up to 4 blocks (64 features) and up to 4 rows of x keeps 16 sums in registers.
// Every output runs the same sequence of dot products whatever the number of rows or threads (threads split the
// units), so a decode step and a verify of K + 1 positions give each position the same bits.
#include "cpu_kernels.h"

#include <cstring>

namespace ssd_cpu {
namespace {

constexpr int64_t kBlock = 16;  // output features per block: one float32 lane each
constexpr int64_t kUnit = 4;    // blocks per unit
// Pairs (64-byte lines of a block) read ahead into L2 by software prefetch: at one row the hardware's prefetcher
// alone kept 4 block streams at ~24 GB/s, with it ~28 (Zen 4, one thread); at 4 rows 9% faster, at 8 the same.
constexpr int64_t kAheadPairs = 16;

#define SSD_TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))

// Rows m0 .. m0 + RB - 1 of x times blocks b0 .. b0 + FB - 1.
template <int RB, int FB>
SSD_TARGET_BF16 void unit_dot(const Bf16Operands& o, int64_t b0, int64_t m0) {
  const int64_t pairs = o.K / 2;
  const uint16_t* w[FB];
  for (int b = 0; b < FB; ++b) w[b] = o.blocks + (b0 + b) * pairs * 32;
  const uint16_t* x[RB];
  for (int i = 0; i < RB; ++i) x[i] = o.x + (m0 + i) * o.K;
  __m512 acc[RB][FB];
  for (int i = 0; i < RB; ++i)
    for (int b = 0; b < FB; ++b) acc[i][b] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh wv[FB];
    for (int b = 0; b < FB; ++b)
      _mm_prefetch(reinterpret_cast<const char*>(w[b] + (p + kAheadPairs) * 32), _MM_HINT_T1);
    for (int b = 0; b < FB; ++b) wv[b] = (__m512bh)_mm512_loadu_si512(w[b] + p * 32);
    for (int i = 0; i < RB; ++i) {
      int32_t pair;  // x[i][2p], x[i][2p + 1] as one 32-bit word
      std::memcpy(&pair, x[i] + 2 * p, 4);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int b = 0; b < FB; ++b) acc[i][b] = _mm512_dpbf16_ps(acc[i][b], wv[b], xv);
    }
  }
  for (int i = 0; i < RB; ++i)
    for (int b = 0; b < FB; ++b) {  // round to bfloat16 (nearest even, as torch rounds)
      const __m256i bits = (__m256i)_mm512_cvtneps_pbh(acc[i][b]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.y + (m0 + i) * o.N + (b0 + b) * kBlock), bits);
    }
}

using UnitFn = void (*)(const Bf16Operands&, int64_t, int64_t);

#define ROW(rb) {unit_dot<rb, 1>, unit_dot<rb, 2>, unit_dot<rb, 3>, unit_dot<rb, 4>}
const UnitFn kUnits[4][4] = {ROW(1), ROW(2), ROW(3), ROW(4)};  // [rows - 1][blocks - 1]
#undef ROW

}  // namespace

// x [M, K] bfloat16, blocks [N / 16, K / 2, 32] bfloat16 -> [M, N] bfloat16, on `path`: kBf16Dot512 (this file) or
// kAmxBf16 (bf16_amx.cpp; K a multiple of 32). The two round differently: a model runs every row count on one.
torch::Tensor bf16_gemm(const torch::Tensor& x, const torch::Tensor& blocks, int64_t path) {
  TORCH_CHECK(x.dim() == 2 && blocks.dim() == 3 && blocks.size(2) == 32 && blocks.size(1) * 2 == x.size(1),
              "bf16_gemm: x [M, K], blocks [N/16, K/2, 32]");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && blocks.scalar_type() == at::kBFloat16 && blocks.is_contiguous(),
              "bf16_gemm: bfloat16 x and contiguous bfloat16 blocks");
  TORCH_CHECK(x.device().is_cpu() && blocks.device().is_cpu(), "bf16_gemm: CPU tensors only");
  TORCH_CHECK(path == kBf16Dot512 || path == kAmxBf16, "bf16_gemm: the path is AVX512-BF16 (8) or AMX-BF16 (16)");
  TORCH_CHECK(supported_paths() & path, "bf16_gemm: this CPU does not run path ", path);
  TORCH_CHECK(path != kAmxBf16 || x.size(1) % 32 == 0, "bf16_gemm: the AMX path needs K a multiple of 32");
  const int64_t M = x.size(0), K = x.size(1), N = blocks.size(0) * kBlock;
  const torch::Tensor xc = x.contiguous();
  torch::Tensor y = torch::empty({M, N}, x.options());
  const Bf16Operands o{reinterpret_cast<const uint16_t*>(blocks.data_ptr<at::BFloat16>()),
                       reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>()),
                       reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), K, N};
  if (path == kAmxBf16) {
    bf16_gemm_amx(o, M);
    return y;
  }
  const int64_t num_blocks = N / kBlock, num_units = (num_blocks + kUnit - 1) / kUnit;
  at::parallel_for(0, num_units, 4, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t b0 = u * kUnit, fb = std::min<int64_t>(kUnit, num_blocks - b0);
      for (int64_t m0 = 0; m0 < M; m0 += kRowsPerPass)
        kUnits[std::min<int64_t>(kRowsPerPass, M - m0) - 1][fb - 1](o, b0, m0);
    }
  });
  return y;
}

}  // namespace ssd_cpu
