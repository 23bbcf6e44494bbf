// y = x @ w.T for a plain float32 weight [N, K] (row-major, as the checkpoint holds it), a few rows of x, on the
// CPU: the decode steps and verifies of a float32 model. At a few rows torch's float32 GEMMs (oneDNN, MKL) read
// the weight below the memory's speed on these CPUs (docs/benchmarks.md); this kernel streams it once per 4 rows.
// (bfloat16 weights have a kernel of their own with its own layout: bf16_gemm.cpp.)
//
// Two paths, chosen by the caller: kFloat512 / kFloat256, float32 FMAs (AVX-512 / AVX2), 4 output features and up
// to 4 rows of x per pass, each output's sum reduced across the vector's lanes at the end.
// Every row of x runs the same arithmetic whatever the number of rows or threads (threads split the output
// features), so a decode step and a verify of K + 1 positions give each position the same bits.
#include "cpu_kernels.h"

namespace ssd_cpu {
namespace {

constexpr int64_t kStep = 32;  // input features per step of the AVX-512 inner loop (two vectors)

struct DenseOperands {
  const float* w;  // [N, K]
  const float* x;  // [M, K]
  float* y;        // [M, N]
  int64_t K, N;
};

// ---- AVX-512: the tile's 4 output features, MB rows of x from m0 ----
template <int MB>
SSD_TARGET_512 void tile_float512(const DenseOperands& o, int64_t tile, int64_t m0) {
  const float* w = o.w + tile * kTile * o.K;
  const float* x = o.x + m0 * o.K;
  __m512 acc[kTile][MB];
  for (int r = 0; r < kTile; ++r)
    for (int i = 0; i < MB; ++i) acc[r][i] = _mm512_setzero_ps();
  for (int64_t k = 0; k < o.K; k += kStep) {
    __m512 xlo[MB], xhi[MB];
    for (int i = 0; i < MB; ++i) xlo[i] = _mm512_loadu_ps(x + i * o.K + k), xhi[i] = _mm512_loadu_ps(x + i * o.K + k + 16);
    for (int r = 0; r < kTile; ++r) {
      const __m512 wlo = _mm512_loadu_ps(w + r * o.K + k), whi = _mm512_loadu_ps(w + r * o.K + k + 16);
      for (int i = 0; i < MB; ++i) {
        acc[r][i] = _mm512_fmadd_ps(wlo, xlo[i], acc[r][i]);
        acc[r][i] = _mm512_fmadd_ps(whi, xhi[i], acc[r][i]);
      }
    }
  }
  for (int r = 0; r < kTile; ++r)
    for (int i = 0; i < MB; ++i) o.y[(m0 + i) * o.N + tile * kTile + r] = _mm512_reduce_add_ps(acc[r][i]);
}

// ---- AVX2 ----
template <int MB>
SSD_TARGET_256 void tile_float256(const DenseOperands& o, int64_t tile, int64_t m0) {
  const float* w = o.w + tile * kTile * o.K;
  const float* x = o.x + m0 * o.K;
  __m256 acc[kTile][MB];
  for (int r = 0; r < kTile; ++r)
    for (int i = 0; i < MB; ++i) acc[r][i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < o.K; k += 8) {
    __m256 xv[MB];
    for (int i = 0; i < MB; ++i) xv[i] = _mm256_loadu_ps(x + i * o.K + k);
    for (int r = 0; r < kTile; ++r) {
      const __m256 wv = _mm256_loadu_ps(w + r * o.K + k);
      for (int i = 0; i < MB; ++i) acc[r][i] = _mm256_fmadd_ps(wv, xv[i], acc[r][i]);
    }
  }
  for (int r = 0; r < kTile; ++r)
    for (int i = 0; i < MB; ++i) o.y[(m0 + i) * o.N + tile * kTile + r] = hsum_256(acc[r][i]);
}

using TileFn = void (*)(const DenseOperands&, int64_t, int64_t);

#define TILE_TABLE(fn) {fn<1>, fn<2>, fn<3>, fn<4>}
const TileFn kTilesFloat512[4] = TILE_TABLE(tile_float512);
const TileFn kTilesFloat256[4] = TILE_TABLE(tile_float256);
#undef TILE_TABLE

}  // namespace

// x [M, K] and weight [N, K], float32 -> [M, N] float32.
torch::Tensor dense_gemm(const torch::Tensor& x, const torch::Tensor& weight, int64_t path) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "dense_gemm: x [M, K], weight [N, K]");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK(K % kStep == 0 && N % kTile == 0, "dense_gemm: K must be a multiple of 32 and N of 4");
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "dense_gemm: float32 x and weight");
  TORCH_CHECK(weight.is_contiguous() && x.device().is_cpu() && weight.device().is_cpu(),
              "dense_gemm: a contiguous weight, CPU tensors only");
  TORCH_CHECK((path == kFloat256 || path == kFloat512) && (supported_paths() & path),
              "dense_gemm: this CPU does not run path ", path);
  const torch::Tensor xc = x.contiguous();
  torch::Tensor y = torch::empty({M, N}, x.options());
  const DenseOperands o{weight.data_ptr<float>(), xc.data_ptr<float>(), y.data_ptr<float>(), K, N};
  run_tiles(path == kFloat512 ? kTilesFloat512 : kTilesFloat256, o, N / kTile, M);
  return y;
}

}  // namespace ssd_cpu
