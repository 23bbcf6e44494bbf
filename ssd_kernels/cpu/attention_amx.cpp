// Causal attention of a few queries per sequence on AMX-BF16 tiles (Sapphire Rapids and later), for bfloat16 q and
// KV cache: one (sequence, KV head) pair at a time, its query "columns" (the G heads of the KV head times the Q
// queries, up to 16 a pass) against all of the sequence's keys.
//
// Scores: 16 keys x 16 columns are one float32 C tile, a tile product per 32 dims of the head: the keys are the A
// tile (16 rows of 32 dims, read in place where 16 slots follow each other in the cache, else copied), the queries
// the B tile (their dims in pairs, AMX's VNNI layout, built once per pass); two blocks of keys are in flight. The
// scores are kept key by key, NC columns a key (the pass's columns rounded up to 4, 8 or 16), so 16 / NC keys share
// a vector and the softmax's exponentials cost no more than the columns need. Then, per column and in key order,
// the exponentials times the value rows (FMA) and their sum, and one division at the end.
//
// Every column's arithmetic is independent of the others' and of the layout: a tile product's outputs are, the
// largest score is a maximum, the exponentials are element by element, a key a column does not see gets exactly 0,
// and the sums run per column in key order up to its last key. So a query gives the same bits in a decode step
// (Q = 1), a verify, or a tree row, whatever the rows around it or the number of threads. Those bits differ from
// layer_ops.cpp's FMA kernel (the dot's and the softmax sum's order), so a model runs all of its attention on one of
// the two (ssd/layers/cpu_kernels.py, attention_path).
#include "amx_tiles.h"
#include "vector512.h"

#include <cstring>
#include <limits>

namespace ssd_cpu {
namespace {

constexpr int64_t kKeys = 16;  // keys per C tile (the A tile's rows)
constexpr int64_t kCols = 16;  // query columns per pass (the B and C tiles' columns)
constexpr int64_t kPrefetch = 8;  // value rows asked for ahead of their use

#define SSD_TARGET_AMX_ATTN \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512vnni,avx512bf16,f16c,fma")))

// The B tiles of a pass: bt[c][k][n] = the dims 32c + 2k, 32c + 2k + 1 of column n (two bfloat16 in a 32-bit word),
// 0 for the columns past `cols`.
void query_tiles(const uint16_t* q, const int64_t* q_rows, int64_t cols, int64_t D, uint32_t* bt) {
  std::memset(bt, 0, sizeof(uint32_t) * (D / 2) * kCols);
  for (int64_t n = 0; n < cols; ++n) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(q + q_rows[n]);  // D / 2 words
    for (int64_t w = 0; w < D / 2; ++w) bt[(w / 16) * 16 * kCols + (w % 16) * kCols + n] = words[w];
  }
}

// Ask for the rows of keys (or values) from .. to - 1 in L1 (each D bfloat16, whole cache lines).
inline void prefetch_rows(const uint16_t* rows, const int64_t* slots, int64_t from, int64_t to, int64_t D) {
  for (int64_t j = from; j < to; ++j)
    for (int64_t e = 0; e < D; e += 32) __builtin_prefetch(rows + slots[j] * D + e, 0, 3);
}

// Where keys j0 .. j0 + 15 can be read as one A tile: in place if their 16 slots follow each other, else copied into
// `rows` (keys past seq_len as zeros: their scores are masked).
const uint16_t* key_rows(const uint16_t* keys, const int64_t* slots, int64_t j0, int64_t seq_len, int64_t D,
                         uint16_t* rows) {
  bool in_place = j0 + kKeys <= seq_len;
  for (int64_t k = 1; in_place && k < kKeys; ++k) in_place = slots[j0 + k] == slots[j0] + k;
  if (in_place) return keys + slots[j0] * D;
  for (int64_t k = 0; k < kKeys; ++k) {
    if (j0 + k < seq_len) std::memcpy(rows + k * D, keys + slots[j0 + k] * D, D * 2);
    else std::memset(rows + k * D, 0, D * 2);
  }
  return rows;
}

// C tile `c` (16 keys x 16 columns) -> the block's rows of scores [.., NC]: the first NC columns of each key (a
// macro: tile numbers are immediates).
#define SSD_STORE_BLOCK(c, scores, NC)                                                             \
  if constexpr (NC == kCols) {                                                                     \
    _tile_stored(c, scores, 64);                                                                   \
  } else {                                                                                         \
    alignas(64) float full[kKeys][kCols];                                                          \
    _tile_stored(c, full, 64);                                                                     \
    for (int64_t k = 0; k < kKeys; ++k) std::memcpy((scores) + k * NC, full[k], NC * sizeof(float)); \
  }

// scores [ceil(seq_len / 16) * 16, NC]: the dot of every key with every column (tiles configured 16 x 64 bytes).
// D = 64: two blocks of keys at a time, C in tmm0 / tmm2, A in tmm4, tmm3 / tmm1, tmm7, B in tmm5-6.
template <int NC>
SSD_TARGET_AMX_ATTN void key_scores_64(const uint16_t* keys, const int64_t* slots, int64_t seq_len,
                                       const uint32_t* bt, float* scores, uint16_t* rows) {
  constexpr int64_t D = 64, stride = D * 2;
  _tile_loadd(5, bt, 64);
  _tile_loadd(6, bt + 16 * kCols, 64);
  for (int64_t j0 = 0; j0 < seq_len; j0 += 2 * kKeys) {
    prefetch_rows(keys, slots, j0 + 2 * kKeys, std::min(j0 + 4 * kKeys, seq_len), D);
    const uint16_t* a = key_rows(keys, slots, j0, seq_len, D, rows);
    const bool two = j0 + kKeys < seq_len;
    const uint16_t* b = two ? key_rows(keys, slots, j0 + kKeys, seq_len, D, rows + kKeys * D) : nullptr;
    _tile_zero(0);
    _tile_loadd(4, a, stride);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(3, a + 32, stride);
    if (two) {
      _tile_zero(2);
      _tile_loadd(1, b, stride);
      _tile_dpbf16ps(2, 1, 5);
      _tile_loadd(7, b + 32, stride);
    }
    _tile_dpbf16ps(0, 3, 6);
    if (two) _tile_dpbf16ps(2, 7, 6);
    SSD_STORE_BLOCK(0, scores + j0 * NC, NC);
    if (two) { SSD_STORE_BLOCK(2, scores + (j0 + kKeys) * NC, NC); }
  }
}

// D = 128: a block at a time, C in tmm0, A in tmm4 / tmm3, B in tmm5-7 and tmm1.
template <int NC>
SSD_TARGET_AMX_ATTN void key_scores_128(const uint16_t* keys, const int64_t* slots, int64_t seq_len,
                                        const uint32_t* bt, float* scores, uint16_t* rows) {
  constexpr int64_t D = 128, stride = D * 2;
  _tile_loadd(5, bt, 64);
  _tile_loadd(6, bt + 16 * kCols, 64);
  _tile_loadd(7, bt + 2 * 16 * kCols, 64);
  _tile_loadd(1, bt + 3 * 16 * kCols, 64);
  for (int64_t j0 = 0; j0 < seq_len; j0 += kKeys) {
    prefetch_rows(keys, slots, j0 + kKeys, std::min(j0 + 2 * kKeys, seq_len), D);
    const uint16_t* a = key_rows(keys, slots, j0, seq_len, D, rows);
    _tile_zero(0);
    _tile_loadd(4, a, stride);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(3, a + 32, stride);
    _tile_dpbf16ps(0, 3, 6);
    _tile_loadd(4, a + 64, stride);
    _tile_dpbf16ps(0, 4, 7);
    _tile_loadd(3, a + 96, stride);
    _tile_dpbf16ps(0, 3, 1);
    SSD_STORE_BLOCK(0, scores + j0 * NC, NC);
  }
}

#undef SSD_STORE_BLOCK

// The lanes' maximum over the lanes of the same column (lane l holds column l % NC).
template <int NC>
SSD_TARGET_AMX_ATTN inline __m512 column_max(__m512 v) {
  if constexpr (NC <= 8) v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));  // l ^ 8
  if constexpr (NC <= 4) v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));  // l ^ 4
  return v;
}

// scores [seq_len, NC] -> each column's e^(score * scale - its largest) over the keys it sees (visible[n] of
// them), exactly 0 past them. visible: [16] int32 (lane l: column l % NC's).
template <int NC>
SSD_TARGET_AMX_ATTN void exp_columns(float* scores, int64_t seq_len, const int32_t* visible, float scale) {
  constexpr int kPerVector = kCols / NC;  // keys a vector holds
  const __m512 minus_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512i seen = _mm512_load_si512(visible), step = _mm512_set1_epi32(kPerVector);
  const int64_t vectors = (seq_len + kPerVector - 1) / kPerVector;
  alignas(64) int32_t first_keys[kCols];
  for (int l = 0; l < kCols; ++l) first_keys[l] = l / NC;
  __m512 best = minus_inf;
  __m512i key = _mm512_load_si512(first_keys);
  for (int64_t v = 0; v < vectors; ++v, key = _mm512_add_epi32(key, step)) {
    const __mmask16 sees = _mm512_cmpgt_epi32_mask(seen, key);
    const __m512 s = _mm512_mask_mov_ps(minus_inf, sees, _mm512_mul_ps(_mm512_loadu_ps(scores + v * kCols),
                                                                        _mm512_set1_ps(scale)));
    _mm512_storeu_ps(scores + v * kCols, s);
    best = _mm512_max_ps(best, s);
  }
  best = column_max<NC>(best);
  key = _mm512_load_si512(first_keys);
  for (int64_t v = 0; v < vectors; ++v, key = _mm512_add_epi32(key, step)) {
    const __mmask16 sees = _mm512_cmpgt_epi32_mask(seen, key);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(scores + v * kCols), best));
    _mm512_storeu_ps(scores + v * kCols, _mm512_maskz_mov_ps(sees, e));
  }
}

// out rows of columns n0 .. n0 + GB - 1 = the sum of their exponentials (scores [seq_len, NC]) times the value
// rows, over each column's visible keys in key order, divided by the exponentials' sum (also in key order).
// D = 16 DV.
template <int DV, int GB, int NC>
SSD_TARGET_AMX_ATTN void value_sums(const at::BFloat16* values, const int64_t* slots, const float* scores, int64_t n0,
                                    const int64_t* visible, const int64_t* out_rows, at::BFloat16* out) {
  constexpr int64_t D = DV * 16;
  int64_t fewest = visible[n0], most = visible[n0];
  for (int g = 1; g < GB; ++g) {
    fewest = std::min(fewest, visible[n0 + g]);
    most = std::max(most, visible[n0 + g]);
  }
  __m512 acc[GB][DV], total[GB];
  for (int g = 0; g < GB; ++g) {
    total[g] = _mm512_setzero_ps();
    for (int v = 0; v < DV; ++v) acc[g][v] = _mm512_setzero_ps();
  }
  const auto* value_rows = reinterpret_cast<const uint16_t*>(values);
  for (int64_t j = 0; j < most; ++j) {
    if (j + kPrefetch < most) prefetch_rows(value_rows, slots, j + kPrefetch, j + kPrefetch + 1, D);
    __m512 value[DV];
    for (int v = 0; v < DV; ++v) value[v] = load16(values + slots[j] * D + 16 * v);
    for (int g = 0; g < GB; ++g) {
      if (j >= fewest && j >= visible[n0 + g]) continue;
      const __m512 e = _mm512_set1_ps(scores[j * NC + n0 + g]);
      total[g] = _mm512_add_ps(total[g], e);
      for (int v = 0; v < DV; ++v) acc[g][v] = _mm512_fmadd_ps(e, value[v], acc[g][v]);
    }
  }
  for (int g = 0; g < GB; ++g)
    for (int v = 0; v < DV; ++v) store16(out + out_rows[n0 + g] + 16 * v, _mm512_div_ps(acc[g][v], total[g]));
}

template <int DV, int NC>
void value_sums_all(const at::BFloat16* values, const int64_t* slots, const float* scores, int64_t cols,
                    const int64_t* visible, const int64_t* out_rows, at::BFloat16* out) {
  using Fn = void (*)(const at::BFloat16*, const int64_t*, const float*, int64_t, const int64_t*, const int64_t*,
                      at::BFloat16*);
  constexpr int kGroup = DV == 4 ? 4 : 2;  // accumulators, sums and a value row within the 32 vector registers
  static const Fn sums[4] = {value_sums<DV, 1, NC>, value_sums<DV, 2, NC>, value_sums<DV, 3, NC>,
                             value_sums<DV, 4, NC>};
  for (int64_t n0 = 0; n0 < cols; n0 += kGroup)
    sums[std::min<int64_t>(kGroup, cols - n0) - 1](values, slots, scores, n0, visible, out_rows, out);
}

// A pass of `cols` columns laid out NC a key: scores, exponentials, the value sums.
template <int NC>
void attend_pass(const uint16_t* keys, const at::BFloat16* values, const int64_t* slots, int64_t seq_len,
                 at::BFloat16* out, int64_t D, float scale, int64_t cols, const int64_t* visible,
                 const int32_t* visible_lanes, const int64_t* rows, AmxAttentionScratch& scratch) {
  float* scores = scratch.scores.data();
  if (D == 64) key_scores_64<NC>(keys, slots, seq_len, scratch.query_words.data(), scores, scratch.rows.data());
  else key_scores_128<NC>(keys, slots, seq_len, scratch.query_words.data(), scores, scratch.rows.data());
  exp_columns<NC>(scores, seq_len, visible_lanes, scale);
  if (D == 64) value_sums_all<4, NC>(values, slots, scores, cols, visible, rows, out);
  else value_sums_all<8, NC>(values, slots, scores, cols, visible, rows, out);
}

// One pass: the columns c0 .. c0 + 15 (at most) of the pair's Q * G.
void attend_columns(const at::BFloat16* q, const at::BFloat16* keys, const at::BFloat16* values, const int64_t* slots,
                    int64_t seq_len, at::BFloat16* out, int64_t b, int64_t kvh, int64_t Q, int64_t H, int64_t G,
                    int64_t D, float scale, int64_t c0, AmxAttentionScratch& scratch) {
  const int64_t cols = std::min(kCols, Q * G - c0);
  int64_t rows[kCols], visible[kCols];
  for (int64_t n = 0; n < kCols; ++n) {
    const int64_t c = c0 + std::min(n, cols - 1), i = c / G, g = c % G;  // past `cols`: a copy of the last
    rows[n] = ((b * Q + i) * H + kvh * G + g) * D;
    visible[n] = seq_len - Q + i + 1;
  }
  query_tiles(reinterpret_cast<const uint16_t*>(q), rows, cols, D, scratch.query_words.data());
  const int nc = cols <= 4 ? 4 : cols <= 8 ? 8 : 16;
  alignas(64) int32_t lanes[kCols];
  for (int64_t l = 0; l < kCols; ++l) lanes[l] = static_cast<int32_t>(visible[std::min<int64_t>(l % nc, cols - 1)]);
  const auto* k16 = reinterpret_cast<const uint16_t*>(keys);
  if (nc == 4) attend_pass<4>(k16, values, slots, seq_len, out, D, scale, cols, visible, lanes, rows, scratch);
  else if (nc == 8) attend_pass<8>(k16, values, slots, seq_len, out, D, scale, cols, visible, lanes, rows, scratch);
  else attend_pass<16>(k16, values, slots, seq_len, out, D, scale, cols, visible, lanes, rows, scratch);
}

}  // namespace

void AmxAttentionScratch::fit(int64_t max_keys, int64_t D) {
  const size_t score_floats = ((max_keys + 2 * kKeys - 1) / (2 * kKeys)) * 2 * kKeys * kCols;
  if (scores.size() < score_floats) scores.resize(score_floats);
  if (rows.size() < static_cast<size_t>(2 * kKeys * D)) rows.resize(2 * kKeys * D);
  if (query_words.size() < static_cast<size_t>(D / 2 * kCols)) query_words.resize(D / 2 * kCols);
}

void attend_group_amx(const at::BFloat16* q, const at::BFloat16* keys, const at::BFloat16* values,
                      const int64_t* slots, int64_t seq_len, at::BFloat16* out, int64_t b, int64_t kvh, int64_t Q,
                      int64_t H, int64_t G, int64_t D, float scale, AmxAttentionScratch& scratch) {
  for (int64_t c0 = 0; c0 < Q * G; c0 += kCols)
    attend_columns(q, keys, values, slots, seq_len, out, b, kvh, Q, H, G, D, scale, c0, scratch);
}

}  // namespace ssd_cpu
