// y = x @ w.T for a group-32 int8 weight (GGUF Q8_0 values: w = q * d, q in -128..127, one fp16 d per 32 input
// features), a few rows of x, on the CPU. The default model's LM head is such a weight.
//
// Weight layout (made by ssd_kernels/cpu/q8_gemm.py), read as one sequential stream:
//   blocks [N / 4, K / 32, 136] uint8: for each tile of 4 output features and group g, the 4 features' 32 codes
//          each (int8), then their d's (4 fp16)
// Two paths, chosen by the caller: kFloat512 / kFloat256 dequantize in registers (q * d is exact in float32, so
// each product is the float weight's) and accumulate in float32 (AVX-512 / AVX2); x as given. Every row runs the
// same arithmetic whatever the number of rows or threads (threads split the output features).
#include "cpu_kernels.h"

#include <cstring>

namespace ssd_cpu {
namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kBlockBytes = kTile * kGroup + kTile * 2;  // a tile's codes and d's for one group

struct Q8Operands {
  const uint8_t* blocks;  // [N / 4, G, 136]
  const float* x;         // [M, K] float32
  float* y;               // [M, N]
  int64_t K, N, G;
};

inline const uint8_t* block_of(const Q8Operands& o, int64_t tile, int64_t g) {
  return o.blocks + (tile * o.G + g) * kBlockBytes;
}

inline uint16_t d_bits(const uint8_t* block, int64_t r) {
  uint16_t bits;
  std::memcpy(&bits, block + kTile * kGroup + 2 * r, 2);
  return bits;
}

// ---- float32, AVX-512: the tile's 4 output features, MB rows of x from m0 ----
template <int MB>
SSD_TARGET_512 void tile_float512(const Q8Operands& o, int64_t tile, int64_t m0) {
  __m512 acc[kTile][MB];
  for (int r = 0; r < kTile; ++r)
    for (int i = 0; i < MB; ++i) acc[r][i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < o.G; ++g) {
    const uint8_t* block = block_of(o, tile, g);
    __m512 xlo[MB], xhi[MB];
    for (int i = 0; i < MB; ++i) {
      xlo[i] = _mm512_loadu_ps(o.x + (m0 + i) * o.K + g * kGroup);
      xhi[i] = _mm512_loadu_ps(o.x + (m0 + i) * o.K + g * kGroup + 16);
    }
    for (int r = 0; r < kTile; ++r) {
      const __m512 d = _mm512_set1_ps(_cvtsh_ss(d_bits(block, r)));
      const __m128i* codes = reinterpret_cast<const __m128i*>(block + r * kGroup);
      const __m512 wlo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(codes))), d);
      const __m512 whi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(codes + 1))), d);
      for (int i = 0; i < MB; ++i) {
        acc[r][i] = _mm512_fmadd_ps(wlo, xlo[i], acc[r][i]);
        acc[r][i] = _mm512_fmadd_ps(whi, xhi[i], acc[r][i]);
      }
    }
  }
  for (int r = 0; r < kTile; ++r)
    for (int i = 0; i < MB; ++i) o.y[(m0 + i) * o.N + tile * kTile + r] = _mm512_reduce_add_ps(acc[r][i]);
}

// ---- float32, AVX2 ----
template <int MB>
SSD_TARGET_256 void tile_float256(const Q8Operands& o, int64_t tile, int64_t m0) {
  __m256 acc[kTile][MB];
  for (int r = 0; r < kTile; ++r)
    for (int i = 0; i < MB; ++i) acc[r][i] = _mm256_setzero_ps();
  for (int64_t g = 0; g < o.G; ++g) {
    const uint8_t* block = block_of(o, tile, g);
    for (int r = 0; r < kTile; ++r) {
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(d_bits(block, r)));
      for (int64_t part = 0; part < kGroup / 8; ++part) {  // codes 8 part .. 8 part + 7 of the group
        const int64_t k = g * kGroup + 8 * part;
        const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + r * kGroup + 8 * part));
        const __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
        for (int i = 0; i < MB; ++i) acc[r][i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(o.x + (m0 + i) * o.K + k), acc[r][i]);
      }
    }
  }
  for (int r = 0; r < kTile; ++r)
    for (int i = 0; i < MB; ++i) o.y[(m0 + i) * o.N + tile * kTile + r] = hsum_256(acc[r][i]);
}

using TileFn = void (*)(const Q8Operands&, int64_t, int64_t);

#define TILE_TABLE(fn) {fn<1>, fn<2>, fn<3>, fn<4>}
const TileFn kTilesFloat512[4] = TILE_TABLE(tile_float512);
const TileFn kTilesFloat256[4] = TILE_TABLE(tile_float256);
#undef TILE_TABLE

}  // namespace

// x [M, K] (any float dtype), blocks [N / 4, K / 32, 136] uint8 -> [M, N] in x's dtype.
torch::Tensor q8_gemm(const torch::Tensor& x, const torch::Tensor& blocks, int64_t path) {
  TORCH_CHECK(x.dim() == 2 && blocks.dim() == 3, "q8_gemm: x [M, K], blocks [N/4, K/32, 136]");
  const int64_t M = x.size(0), K = x.size(1), N = blocks.size(0) * kTile, G = K / kGroup;
  TORCH_CHECK(K % kGroup == 0 && blocks.size(1) == G && blocks.size(2) == kBlockBytes,
              "q8_gemm: K must be a multiple of 32 and blocks [N/4, K/32, 136]");
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.is_contiguous(), "q8_gemm: blocks contiguous uint8");
  TORCH_CHECK(x.device().is_cpu() && blocks.device().is_cpu(), "q8_gemm: CPU tensors only");
  TORCH_CHECK((path == kFloat256 || path == kFloat512) && (supported_paths() & path),
              "q8_gemm: this CPU does not run path ", path);
  const torch::Tensor xf = x.to(at::kFloat).contiguous();
  torch::Tensor y = torch::empty({M, N}, x.options().dtype(at::kFloat));
  const Q8Operands o{blocks.data_ptr<uint8_t>(), xf.data_ptr<float>(), y.data_ptr<float>(), K, N, G};
  run_tiles(path == kFloat512 ? kTilesFloat512 : kTilesFloat256, o, N / kTile, M);
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace ssd_cpu
