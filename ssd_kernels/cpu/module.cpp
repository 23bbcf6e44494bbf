// The Python module of the project's CPU kernels: CPU feature detection and the bindings.
#include "cpu_kernels.h"

#include <pybind11/stl.h>

namespace ssd_cpu {

int64_t supported_paths() {
  int64_t bits = 0;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) bits |= kFloat256;
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  if (avx512 && (bits & kFloat256)) bits |= kFloat512;
  if ((bits & kFloat512) && __builtin_cpu_supports("avx512vnni")) bits |= kVnni512;
  if ((bits & kFloat512) && __builtin_cpu_supports("avx512bf16")) bits |= kBf16Dot512;
  if ((bits & kBf16Dot512) && amx_bf16_ready()) bits |= kAmxBf16;
  return bits;
}

}  // namespace ssd_cpu

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  using release_gil = py::call_guard<py::gil_scoped_release>;  // the kernels touch no Python object
  m.def("int4_gemm", &ssd_cpu::int4_gemm, "y = x @ w.T for a group-32 int4 weight (see int4_gemm.cpp)", release_gil());
  m.def("q8_gemm", &ssd_cpu::q8_gemm, "y = x @ w.T for a group-32 int8 weight, GGUF Q8_0 (see q8_gemm.cpp)",
        release_gil());
  m.def("dense_gemm", &ssd_cpu::dense_gemm, "y = x @ w.T for a float32 weight [N, K] (see dense_gemm.cpp)",
        release_gil());
  m.def("bf16_gemm", &ssd_cpu::bf16_gemm,
        "y = x @ w.T for a bfloat16 weight in blocks, by path: AVX512-BF16 or AMX-BF16 (see bf16_gemm.cpp)",
        release_gil());
  m.def("int4_bf16_gemm", &ssd_cpu::int4_bf16_gemm,
        "y = x @ w.T for a group-32 int4 weight in blocks and bfloat16 x, by path (see int4_bf16_gemm.cpp)",
        release_gil());
  m.def("q8_bf16_gemm", &ssd_cpu::q8_bf16_gemm,
        "y = x @ w.T for a group-32 int8 weight in blocks and bfloat16 x, by path (see q8_bf16_gemm.cpp)",
        release_gil());
  m.def("rms_norm", &ssd_cpu::rms_norm, "RMSNorm of x (+ residual): [normed] or [normed, x + residual]");
  m.def("rope", &ssd_cpu::rope, "rotary embedding (rotate-half) of x [T, heads, D] at positions [T]");
  m.def("silu_mul", &ssd_cpu::silu_mul, "silu(x[:, :I]) * x[:, I:]");
  m.def("argmax_rows", &ssd_cpu::argmax_rows,
        "torch.argmax(logits, -1) of float32 logits [N, V] by path: 2 AVX-512, 1 AVX2, 0 scalar", release_gil());
  m.def("store_kv", &ssd_cpu::store_kv, "write the new keys and values into their cache slots");
  m.def("paged_attention", &ssd_cpu::paged_attention,
        "causal attention of the last Q queries of each sequence, by path: 0 vector loops, 16 AMX-BF16", py::arg("q"),
        py::arg("kv_cache"), py::arg("kv_slots"), py::arg("seq_lens"), py::arg("num_queries"), py::arg("scale"),
        py::arg("path") = 0, release_gil());
  m.def("rope_attention", &ssd_cpu::rope_attention, "RoPE, store K/V and paged attention from a fused qkv row",
        py::arg("qkv"), py::arg("positions"), py::arg("cos"), py::arg("sin"), py::arg("kv_cache"), py::arg("slots"),
        py::arg("kv_slots"), py::arg("seq_lens"), py::arg("num_queries"), py::arg("num_heads"),
        py::arg("num_kv_heads"), py::arg("scale"), py::arg("path") = 0, release_gil());
  py::class_<ssd_cpu::Linear>(m, "Linear", "one linear layer's matmul by kind (see cpu_kernels.h)")
      .def(py::init<int64_t, torch::Tensor, c10::optional<torch::Tensor>, c10::optional<torch::Tensor>, int64_t>(),
           py::arg("kind"), py::arg("weight"), py::arg("aux"), py::arg("bias"), py::arg("param"))
      .def("__call__", &ssd_cpu::Linear::operator(), release_gil());
  py::class_<ssd_cpu::DecoderLayer>(m, "DecoderLayer", "a pre-norm Llama decoder layer as one call (decoder_layer.cpp)")
      .def(py::init<ssd_cpu::Linear, ssd_cpu::Linear, ssd_cpu::Linear, ssd_cpu::Linear, torch::Tensor, torch::Tensor,
                    double, torch::Tensor, torch::Tensor, int64_t, int64_t, double, int64_t>())
      .def("forward", &ssd_cpu::DecoderLayer::forward, release_gil());
  py::class_<ssd_cpu::DecoderStack>(m, "DecoderStack", "a model's decoder layers in order as one call (decoder_layer.cpp)")
      .def(py::init<std::vector<ssd_cpu::DecoderLayer>>())
      .def("forward", &ssd_cpu::DecoderStack::forward, release_gil());
  m.def("supported_paths", &ssd_cpu::supported_paths,
        "bit set of the paths this CPU runs: 1 float AVX2, 2 float AVX-512, 4 VNNI, 8 AVX512-BF16, 16 AMX-BF16");
}
