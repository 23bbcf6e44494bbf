// y = x @ w.T for a bfloat16 weight in bf16_gemm.cpp's block layout, on a CPU with AMX-BF16 (Sapphire Rapids and
// later): the same blocks, read as AMX tiles, so a decode step, a verify and a batch of 16 rows cost about the same
// (one pass over the weight), where the AVX512-BF16 loop of bf16_gemm.cpp grows with the rows from ~5 of them.
//
// The block layout [N / 16, K / 2, 32] is already AMX's "VNNI" layout of a B tile: 16 consecutive pairs of a block
// (1 KiB, 64 bytes a row) are one 16 x 64-byte tile, row p holding the 16 features' weights for inputs 2p, 2p + 1.
// x's rows at 32 inputs a chunk are the A tile (up to 16 rows x 64 bytes, stride K), and tdpbf16ps adds the chunk's
// 32 products of every (row, feature) into a float32 C tile. A unit of up to 4 blocks keeps 4 C tiles; per chunk it
// loads x's tile once and each block's tile once. Tiles: C in tmm0-3, A in tmm4, B in tmm5-7 (in turn, so a load
// need not wait for the product before it). No software prefetch: at one row the hardware's alone streamed the
// weight 1-5% faster than prefetching 1-4 chunks ahead into L1 or L2 (Sapphire Rapids, one thread).
// Every output row runs the same sequence of tile products whatever the number of rows or threads (a tile's rows are
// independent), so a decode step and a verify give each position the same bits. K must be a multiple of 32.
// Its bits differ from bf16_gemm.cpp's in a few outputs in ten thousand: vdpbf16ps adds a sum's products pair by
// pair in float32, a tile product adds 32 of them to it at once (measured against both orders), so a model runs
// every row count on one of the two paths.
#include "amx_tiles.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ssd_cpu {
namespace {

using amxtiles::kBlock;
using amxtiles::kTileRows;
using amxtiles::kUnit;
constexpr int64_t kChunk = 32;  // inputs per tile product (16 pairs)

#define SSD_TARGET_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

// The tile configuration (palette 1): C tiles 0-3 and A tile 4 `rows` x 64 bytes, B tiles 5-7 16 x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  explicit TileConfig(int64_t x_rows) {
    for (int t = 0; t < 8; ++t) {
      colsb[t] = 64;
      rows[t] = static_cast<uint8_t>(t < 5 ? x_rows : kTileRows);
    }
  }
};

#define SSD_TILE_STEP(c, b, ptr)                     \
  _tile_loadd(b, ptr, 64);                           \
  _tile_dpbf16ps(c, 4, b);

// Rows m0 .. m0 + rows - 1 of x (rows as configured) times blocks b0 .. b0 + FB - 1.
template <int FB>
SSD_TARGET_AMX void unit_tiles(const Bf16Operands& o, int64_t b0, int64_t m0, int64_t rows) {
  const int64_t pairs = o.K / 2, chunks = o.K / kChunk;
  const uint16_t* w[FB];
  for (int b = 0; b < FB; ++b) w[b] = o.blocks + (b0 + b) * pairs * 32;
  _tile_zero(0);
  if (FB > 1) _tile_zero(1);
  if (FB > 2) _tile_zero(2);
  if (FB > 3) _tile_zero(3);
  const uint16_t* x = o.x + m0 * o.K;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t at = c * kChunk * kBlock;  // elements: a chunk of a block is 16 pairs x 32 numbers
    _tile_loadd(4, x + c * kChunk, o.K * 2);
    SSD_TILE_STEP(0, 5, w[0] + at);
    if (FB > 1) { SSD_TILE_STEP(1, 6, w[1] + at); }
    if (FB > 2) { SSD_TILE_STEP(2, 7, w[2] + at); }
    if (FB > 3) { SSD_TILE_STEP(3, 5, w[3] + at); }
  }
  amxtiles::store_unit<FB>(o.y, o.N, b0, m0, rows);
}

#undef SSD_TILE_STEP

using UnitFn = void (*)(const Bf16Operands&, int64_t, int64_t, int64_t);
const UnitFn kUnits[4] = {unit_tiles<1>, unit_tiles<2>, unit_tiles<3>, unit_tiles<4>};

SSD_TARGET_AMX void configure_tiles(int64_t rows) {
  const TileConfig config(rows);
  __asm__ volatile("" : : "r"(&config) : "memory");  // the compiler does not see ldtilecfg read the config
  _tile_loadconfig(&config);
}

SSD_TARGET_AMX void release_tiles() { _tile_release(); }

bool os_allows_amx() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 22) & 1) || !((d >> 24) & 1)) return false;  // BF16, TILE
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return false;  // OSXSAVE: xgetbv is allowed
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;  // the OS saves tile config and tile data
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;  // Linux: ask to use the tile data
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

void amx_configure(int64_t rows) { configure_tiles(rows); }

void amx_release() { release_tiles(); }

bool amx_bf16_ready() {
  static const bool ready = os_allows_amx();
  return ready;
}

void bf16_gemm_amx(const Bf16Operands& o, int64_t M) {
  const int64_t num_blocks = o.N / kBlock, num_units = (num_blocks + kUnit - 1) / kUnit;
  at::parallel_for(0, num_units, 4, [&](int64_t begin, int64_t end) {
    int64_t configured = 0;  // the rows the tiles are configured for (per thread)
    for (int64_t u = begin; u < end; ++u) {
      const int64_t b0 = u * kUnit, fb = std::min<int64_t>(kUnit, num_blocks - b0);
      for (int64_t m0 = 0; m0 < M; m0 += kTileRows) {
        const int64_t rows = std::min<int64_t>(kTileRows, M - m0);
        if (rows != configured) amx_configure(configured = rows);
        kUnits[fb - 1](o, b0, m0, rows);
      }
    }
    if (configured) amx_release();
  });
}

}  // namespace ssd_cpu
