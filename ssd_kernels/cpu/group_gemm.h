// The entry of the group-32 quantized kernels for bfloat16 x (int4_bf16_gemm.cpp, q8_bf16_gemm.cpp): checks the
// operands and runs a Format on its path, the AVX512-BF16 loop (bf16_dot_units.h) or the AMX-BF16 one
// (group_amx_units.h). The two round differently, so a model runs every row count on one of them.
#pragma once

#include "bf16_dot_units.h"
#include "group_amx_units.h"

namespace ssd_cpu {
namespace groupgemm {

// y = x @ w.T for blocks [N / 16, K / 32, Format::kGroupBytes] uint8 and x [M, K] bfloat16 -> [M, N] bfloat16, on
// `path`: kBf16Dot512 or kAmxBf16.
template <class Format>
torch::Tensor gemm(const torch::Tensor& x, const torch::Tensor& blocks, int64_t path, const char* name) {
  using bf16dot::kBlock;
  using bf16dot::kGroup;
  TORCH_CHECK(x.dim() == 2 && blocks.dim() == 3 && blocks.size(2) == Format::kGroupBytes && x.size(1) % kGroup == 0 &&
                  blocks.size(1) * kGroup == x.size(1),
              name, ": x [M, K] with K a multiple of 32, blocks [N/16, K/32, ", Format::kGroupBytes, "]");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && blocks.scalar_type() == at::kByte && blocks.is_contiguous(),
              name, ": bfloat16 x and contiguous uint8 blocks");
  TORCH_CHECK(x.device().is_cpu() && blocks.device().is_cpu(), name, ": CPU tensors only");
  TORCH_CHECK(path == kBf16Dot512 || path == kAmxBf16, name, ": the path is AVX512-BF16 (8) or AMX-BF16 (16)");
  TORCH_CHECK(supported_paths() & path, name, ": this CPU does not run path ", path);
  const int64_t M = x.size(0), K = x.size(1), G = K / kGroup, N = blocks.size(0) * kBlock;
  const torch::Tensor xc = x.contiguous();
  const auto* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  const bool needs_sums = Format::kNeedsSums && path == kBf16Dot512;  // the tiles take dequantized weights
  torch::Tensor xsum;
  if (needs_sums) {
    xsum = torch::empty({M, G}, x.options().dtype(at::kFloat));
    bf16dot::group_sums(xp, M, K, xsum.data_ptr<float>());
  }
  torch::Tensor y = torch::empty({M, N}, x.options());
  const bf16dot::Operands o{blocks.data_ptr<uint8_t>(), xp, needs_sums ? xsum.data_ptr<float>() : nullptr,
                            reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), K, N, G, M <= 2};
  if (path == kAmxBf16)
    groupamx::run_units<Format>(o, M);
  else
    bf16dot::run_units<Format>(o, M);
  return y;
}

}  // namespace groupgemm
}  // namespace ssd_cpu
