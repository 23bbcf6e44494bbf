// y = x @ w.T for a group-32 int4 weight (GGUF Q4_0 / Q4_1 values), a few rows of x, on the CPU.
//
// Weight layout (made by ssd_kernels/cpu/int4_gemm.py from the portable codes), read as one sequential stream:
//   blocks [N / 4, K / 64, 144] uint8: for each tile of 4 output features and pair of groups (2p, 2p + 1), the 4
//          features' 32 code bytes each (16 for group 2p, then 16 for 2p + 1; byte j of a group holds q[j] in its
//          low nibble and q[j + 16] in its high one, q in 0..15), then their d's (4 x 2 fp16)
//   mins   [N, K / 32] fp16 bits: each group's m; w = q * d + m (Q4_1 as stored; Q4_0: m = -8 d)
// Three paths, chosen by the caller:
//   kFloat512: dequantize in registers and accumulate in float32 (AVX-512); x as given.
//   kFloat256: float32 dot products of the codes with x per group, times d, plus sum_g m_g * sum(x_g) (AVX2).
//   kVnni512: x rounded to int8 in groups of 32 (one scale each, as llama.cpp's Q8 activations), integer dot
//             products of the 4-bit codes with them (AVX-512 VNNI), scaled and accumulated in float32.
// Every row of x runs the same arithmetic whatever the number of rows or threads (threads split the output
// features), so a decode step and a verify of K + 1 positions give each position the same bits.
#include "cpu_kernels.h"

#include <cmath>
#include <cstring>

namespace ssd_cpu {
namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kBlockBytes = kTile * 32 + kTile * 2 * 2;  // a tile's codes and d's for one pair of groups

// The operands of one call, shared by every tile.
struct Operands {
  const uint8_t* blocks;  // [N / 4, P, 144]
  const uint16_t* mins;   // [N, G] fp16 bits
  const float* x;         // [M, K] float32 (float paths)
  const int8_t* xq;       // [M, P, 64] int8, each pair of groups in the VNNI lane order (kVnni512)
  const float* xscale;    // [M, P, 16] the int8 scale of each int32 lane (kVnni512)
  const float* xsum;      // [M, G] float32 sums of x's groups (kVnni512, kFloat256)
  float* y;               // [M, N]
  int64_t K, N, G, P;
};

#define TARGET_512 SSD_TARGET_512
#define TARGET_256 SSD_TARGET_256

inline const uint8_t* block_of(const Operands& o, int64_t tile, int64_t p) { return o.blocks + (tile * o.P + p) * kBlockBytes; }
inline uint16_t d_bits(const uint8_t* block, int64_t r, int64_t h) {
  uint16_t bits;
  std::memcpy(&bits, block + kTile * 32 + (2 * r + h) * 2, 2);
  return bits;
}

// ---- float32, AVX-512: the tile's 4 output features, MB rows of x from m0 ----
template <int MB>
TARGET_512 void tile_float512(const Operands& o, int64_t tile, int64_t m0) {
  const __m512i low4 = _mm512_set1_epi32(0xF);
  __m512 acc[kTile][MB];
  for (int r = 0; r < kTile; ++r)
    for (int i = 0; i < MB; ++i) acc[r][i] = _mm512_setzero_ps();
  for (int64_t p = 0; p < o.P; ++p) {
    const uint8_t* block = block_of(o, tile, p);
    for (int64_t h = 0; h < 2; ++h) {
      const int64_t g = 2 * p + h;
      __m512 xlo[MB], xhi[MB];
      for (int i = 0; i < MB; ++i) {
        xlo[i] = _mm512_loadu_ps(o.x + (m0 + i) * o.K + g * kGroup);
        xhi[i] = _mm512_loadu_ps(o.x + (m0 + i) * o.K + g * kGroup + 16);
      }
      for (int r = 0; r < kTile; ++r) {
        const int64_t n = tile * kTile + r;
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + r * 32 + h * 16)));
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(d_bits(block, r, h)));
        const __m512 m = _mm512_set1_ps(_cvtsh_ss(o.mins[n * o.G + g]));
        const __m512 wlo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, low4)), d, m);
        const __m512 whi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), d, m);
        for (int i = 0; i < MB; ++i) {
          acc[r][i] = _mm512_fmadd_ps(wlo, xlo[i], acc[r][i]);
          acc[r][i] = _mm512_fmadd_ps(whi, xhi[i], acc[r][i]);
        }
      }
    }
  }
  for (int r = 0; r < kTile; ++r)
    for (int i = 0; i < MB; ++i) o.y[(m0 + i) * o.N + tile * kTile + r] = _mm512_reduce_add_ps(acc[r][i]);
}

// ---- float32, AVX2: y = sum_g d_g (q_g . x_g) + sum_g m_g xsum_g (the dequantizing fma and the broadcast of m
// leave the inner loop, which is bound by its instruction count on AVX2 CPUs) ----
TARGET_256 inline float min_term_256(const Operands& o, int64_t n, int64_t row) {  // sum_g m[n, g] * xsum[row, g]
  const uint16_t* m = o.mins + n * o.G;
  const float* xs = o.xsum + row * o.G;
  __m256 acc = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= o.G; g += 8)
    acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m + g))), _mm256_loadu_ps(xs + g), acc);
  float sum = hsum_256(acc);
  for (; g < o.G; ++g) sum += _cvtsh_ss(m[g]) * xs[g];
  return sum;
}

template <int MB>
TARGET_256 void tile_float256(const Operands& o, int64_t tile, int64_t m0) {
  const __m256i low4 = _mm256_set1_epi32(0xF);
  __m256 acc[kTile][MB];
  for (int r = 0; r < kTile; ++r)
    for (int i = 0; i < MB; ++i) acc[r][i] = _mm256_setzero_ps();
  for (int64_t p = 0; p < o.P; ++p) {
    const uint8_t* block = block_of(o, tile, p);
    for (int64_t h = 0; h < 2; ++h) {
      const int64_t k = (2 * p + h) * kGroup;
      __m256 xv[MB][4];  // x[k .. k + 31] in 4 x 8
      for (int i = 0; i < MB; ++i)
        for (int c = 0; c < 4; ++c) xv[i][c] = _mm256_loadu_ps(o.x + (m0 + i) * o.K + k + 8 * c);
      for (int r = 0; r < kTile; ++r) {
        const uint8_t* codes = block + r * 32 + h * 16;  // byte j: q[j] low nibble, q[j + 16] high
        const __m256i c0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
        const __m256i c1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + 8)));
        const __m256 q0 = _mm256_cvtepi32_ps(_mm256_and_si256(c0, low4));  // q[0 .. 7]
        const __m256 q1 = _mm256_cvtepi32_ps(_mm256_and_si256(c1, low4));  // q[8 .. 15]
        const __m256 q2 = _mm256_cvtepi32_ps(_mm256_srli_epi32(c0, 4));    // q[16 .. 23]
        const __m256 q3 = _mm256_cvtepi32_ps(_mm256_srli_epi32(c1, 4));    // q[24 .. 31]
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(d_bits(block, r, h)));
        for (int i = 0; i < MB; ++i) {
          __m256 dot = _mm256_mul_ps(q0, xv[i][0]);
          dot = _mm256_fmadd_ps(q1, xv[i][1], dot);
          dot = _mm256_fmadd_ps(q2, xv[i][2], dot);
          dot = _mm256_fmadd_ps(q3, xv[i][3], dot);
          acc[r][i] = _mm256_fmadd_ps(dot, d, acc[r][i]);
        }
      }
    }
  }
  for (int r = 0; r < kTile; ++r)
    for (int i = 0; i < MB; ++i) {
      const int64_t n = tile * kTile + r;
      o.y[(m0 + i) * o.N + n] = hsum_256(acc[r][i]) + min_term_256(o, n, m0 + i);
    }
}

// x [M, K] -> the sums of its groups of 32, [M, G] (the float AVX2 path's min term).
void group_sums(const float* x, int64_t M, int64_t K, float* xsum) {
  for (int64_t row = 0; row < M; ++row)
    for (int64_t g = 0; g < K / kGroup; ++g) {
      float sum = 0.f;
      for (int j = 0; j < kGroup; ++j) sum += x[row * K + g * kGroup + j];
      xsum[row * (K / kGroup) + g] = sum;
    }
}

// ---- int8 activations, AVX-512 VNNI ----
// A feature's 32 code bytes of a pair of groups (2p, 2p + 1), low nibbles then high nibbles, make 64 weight bytes in
// the order [q_2p[0:16], q_2p+1[0:16], q_2p[16:32], q_2p+1[16:32]], the order xq is laid out in. int32 lane l of
// the dot product sums 4 of those bytes: lanes 0-3 and 8-11 belong to group 2p, 4-7 and 12-15 to group 2p + 1.
TARGET_512 inline float min_term(const Operands& o, int64_t n, int64_t row) {  // sum_g m[n, g] * xsum[row, g]
  __m512 acc = _mm512_setzero_ps();
  for (int64_t g = 0; g < o.G; g += 16) {
    const __mmask16 k = o.G - g >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (o.G - g)) - 1);
    const __m512 m = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, o.mins + n * o.G + g));
    acc = _mm512_fmadd_ps(m, _mm512_maskz_loadu_ps(k, o.xsum + row * o.G + g), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

template <int MB>
TARGET_512 void tile_vnni512(const Operands& o, int64_t tile, int64_t m0) {
  const __m256i low4 = _mm256_set1_epi8(0xF);
  const __m512i pair_lanes = _mm512_set_epi32(1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0);
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc[kTile][MB];
  for (int r = 0; r < kTile; ++r)
    for (int i = 0; i < MB; ++i) acc[r][i] = _mm512_setzero_ps();
  for (int64_t p = 0; p < o.P; ++p) {
    const uint8_t* block = block_of(o, tile, p);
    __m512i xv[MB];
    __m512 xs[MB];
    for (int i = 0; i < MB; ++i) {
      xv[i] = _mm512_loadu_si512(o.xq + ((m0 + i) * o.P + p) * 64);
      xs[i] = _mm512_loadu_ps(o.xscale + ((m0 + i) * o.P + p) * 16);
    }
    const __m512 d4 = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kTile * 32))));
    for (int r = 0; r < kTile; ++r) {
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + r * 32));
      const __m256i lo = _mm256_and_si256(c, low4), hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), low4);
      const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      const __m512 d = _mm512_permutexvar_ps(_mm512_add_epi32(pair_lanes, _mm512_set1_epi32(2 * r)), d4);
      for (int i = 0; i < MB; ++i) {
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, w, xv[i]));
        acc[r][i] = _mm512_fmadd_ps(dot, _mm512_mul_ps(d, xs[i]), acc[r][i]);
      }
    }
  }
  for (int r = 0; r < kTile; ++r)
    for (int i = 0; i < MB; ++i) {
      const int64_t n = tile * kTile + r;
      o.y[(m0 + i) * o.N + n] = _mm512_reduce_add_ps(acc[r][i]) + min_term(o, n, m0 + i);
    }
}

// x [M, K] float32 -> the VNNI operands: int8 codes per group of 32 (scale amax / 127), lane scales, group sums.
void quantize_rows(const float* x, int64_t M, int64_t K, int8_t* xq, float* xscale, float* xsum) {
  const int64_t G = K / kGroup, P = G / 2;
  for (int64_t row = 0; row < M; ++row) {
    for (int64_t g = 0; g < G; ++g) {
      const float* v = x + row * K + g * kGroup;
      float amax = 0.f, sum = 0.f;
      for (int j = 0; j < kGroup; ++j) amax = std::max(amax, std::fabs(v[j])), sum += v[j];
      const float scale = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      const int64_t p = g / 2, h = g % 2;
      int8_t* dst = xq + (row * P + p) * 64;
      for (int j = 0; j < kGroup; ++j)
        dst[(j < 16 ? 0 : 32) + 16 * h + j % 16] = static_cast<int8_t>(std::nearbyint(v[j] * inv));
      float* lanes = xscale + (row * P + p) * 16;
      for (int l = 0; l < 4; ++l) lanes[4 * h + l] = lanes[8 + 4 * h + l] = scale;
      xsum[row * G + g] = sum;
    }
  }
}

using TileFn = void (*)(const Operands&, int64_t, int64_t);

// kTiles*[mb - 1]: a tile's pass over mb rows of x (1..kRowsPerPass).
#define TILE_TABLE(fn) {fn<1>, fn<2>, fn<3>, fn<4>}
const TileFn kTilesFloat512[4] = TILE_TABLE(tile_float512);
const TileFn kTilesFloat256[4] = TILE_TABLE(tile_float256);
const TileFn kTilesVnni512[4] = TILE_TABLE(tile_vnni512);
#undef TILE_TABLE

}  // namespace

// x [M, K] (any float dtype), blocks [N / 4, K / 64, 144] uint8, mins [N, K / 32] int16 (fp16 bits)
// -> [M, N] in x's dtype.
torch::Tensor int4_gemm(const torch::Tensor& x, const torch::Tensor& blocks, const torch::Tensor& mins, int64_t path) {
  TORCH_CHECK(x.dim() == 2 && blocks.dim() == 3 && mins.dim() == 2, "int4_gemm: x [M, K], blocks [N/4, K/64, 144], mins [N, K/32]");
  const int64_t M = x.size(0), K = x.size(1), N = mins.size(0), G = K / kGroup;
  TORCH_CHECK(K % (2 * kGroup) == 0 && N % kTile == 0, "int4_gemm: K must be a multiple of 64 and N of 4");
  TORCH_CHECK(blocks.size(0) == N / kTile && blocks.size(1) == G / 2 && blocks.size(2) == kBlockBytes && mins.size(1) == G,
              "int4_gemm: blocks must be [N/4, K/64, 144] and mins [N, K/32]");
  TORCH_CHECK(blocks.scalar_type() == at::kByte && mins.scalar_type() == at::kShort, "int4_gemm: blocks uint8, mins int16");
  TORCH_CHECK(blocks.is_contiguous() && mins.is_contiguous(), "int4_gemm: blocks and mins must be contiguous");
  TORCH_CHECK(x.device().is_cpu() && blocks.device().is_cpu() && mins.device().is_cpu(), "int4_gemm: CPU tensors only");
  TORCH_CHECK((path == kFloat256 || path == kFloat512 || path == kVnni512) && (supported_paths() & path),
              "int4_gemm: this CPU does not run path ", path);
  const torch::Tensor xf = x.to(at::kFloat).contiguous();
  torch::Tensor y = torch::empty({M, N}, x.options().dtype(at::kFloat));
  Operands o{blocks.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(mins.data_ptr<int16_t>()),
             xf.data_ptr<float>(), nullptr, nullptr, nullptr, y.data_ptr<float>(), K, N, G, G / 2};
  if (path == kVnni512) {
    torch::Tensor xq = torch::empty({M, G / 2, 64}, x.options().dtype(at::kChar));
    torch::Tensor xscale = torch::empty({M, G / 2, 16}, x.options().dtype(at::kFloat));
    torch::Tensor xsum = torch::empty({M, G}, x.options().dtype(at::kFloat));
    quantize_rows(o.x, M, K, xq.data_ptr<int8_t>(), xscale.data_ptr<float>(), xsum.data_ptr<float>());
    o.xq = xq.data_ptr<int8_t>(), o.xscale = xscale.data_ptr<float>(), o.xsum = xsum.data_ptr<float>();
    run_tiles(kTilesVnni512, o, N / kTile, M);
  } else if (path == kFloat256) {
    torch::Tensor xsum = torch::empty({M, G}, x.options().dtype(at::kFloat));
    group_sums(o.x, M, K, xsum.data_ptr<float>());
    o.xsum = xsum.data_ptr<float>();
    run_tiles(kTilesFloat256, o, N / kTile, M);
  } else {
    run_tiles(kTilesFloat512, o, N / kTile, M);
  }
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace ssd_cpu
