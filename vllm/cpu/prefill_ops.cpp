// Prefill attention over the paged KV cache, blocked flash-style (see prefill_ops.py).
//
// Why a kernel of its own: a prompt (or a chunk of one, after a prefix-cache hit or an
// earlier chunk) of T new tokens attends causally to C + T cached positions. Row by
// row through the decode kernel that reads every key and value once per query row,
// T * (C + T) row reads per head; one scaled_dot_product_attention call per sequence
// pays its fixed costs per sequence and, with a context, needs the context gathered
// out of the cache first. Here a tile of QT query rows (times the query heads sharing
// a KV head) is scored against tiles of KT keys read straight out of the cache through
// the block table: each key and value row is read and converted once per query tile,
// the scores live in a small buffer (online softmax: running max and sum per row), and
// tiles wholly above the causal diagonal are never touched.
//
// Layouts: k_cache / v_cache are one layer's `[kv_heads, num_slots, head_size]`
// halves (torch_sdpa.py's head-major cache); q rows `[tokens, >= hq * d]` with a row
// stride; out rows `[tokens, hq * d]` with a row stride. Sequence s owns query rows
// [query_start[s], query_start[s] + query_len[s]) at positions context_len[s] + r; its
// K/V for those rows are already in the cache (written before attention).
//
// Numerics: scores, softmax and the P.V sums in float32; one rounding to the output
// dtype at the end. Plain C++ with GCC vector types for the register-blocked products
// (QK^T and P.V as small matrix blocks held in registers), so -O3 -march=native makes
// AVX2 or AVX-512 code from the same source, no intrinsics.
// The small helpers below mirror cpu_ops.cpp's (a separate library, built and cached
// on its own by loader.py).
//
// bf16 products: bf16 models with head sizes that are a multiple of 32 take one of two
// more paths where the compiler targets them (-march=native):
// - AVX512-BF16 (Cooper Lake, Sapphire Rapids and later; prefill_tile_dot): both
//   products are `vdpbf16ps`, 16 pairs of bf16 multiplied and summed into 16 float32
//   lanes per instruction, with no widening of Q, K or V first.
// - AMX (Sapphire Rapids and later, Linux lending the tile state; prefill_tile_amx):
//   both products are `tdpbf16ps` on 16 x 32 by 32 x 16 tiles.
// Both read K and V repacked in pairs (channel pairs of K, key pairs of V) and share one
// AVX-512 softmax pass per score row. The float32 path converts every K and V element
// to float per query tile; on a Sapphire Rapids core it lost to the row-wise decode
// kernel (itself on bf16 dot products) at short prompts and to torch's SDPA at long
// ones. What changes numerically: Q and K enter QK^T exactly (bf16 products are exact
// in float32; only the sums round) and the scale is applied to the float32 scores; the
// probabilities are rounded to bf16 before P.V (relative error 2^-9 each, as flash
// attention does on GPUs); the running max and sum (from the unrounded probabilities)
// and the output sums stay float32 and the output is rounded once.
//
// dtype codes: 0 = float32, 1 = bfloat16 (stored as uint16_t).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "vec_math.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>
#define VLLM_PREFILL_BF16_DOT 1
#else
#define VLLM_PREFILL_BF16_DOT 0
#endif

#if VLLM_PREFILL_BF16_DOT && defined(__AMX_TILE__) && defined(__AMX_BF16__) && \
    defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define VLLM_PREFILL_AMX 1
#else
#define VLLM_PREFILL_AMX 0
#endif

namespace {

using bf16 = uint16_t;

inline float to_f(float x) { return x; }
inline float to_f(bf16 x) {
  uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename T> inline T from_f(float x);
template <> inline float from_f<float>(float x) { return x; }
template <> inline bf16 from_f<bf16>(float x) {  // round to nearest even, as torch
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16>(u >> 16);
}

// exp(x) for x <= 0 without libm, so loops calling it vectorize (cpu_ops.cpp's).
inline float exp_nonpos(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

constexpr int64_t QT = 16;  // query rows (tokens) per tile, times the group's heads
constexpr int64_t KT = 32;  // keys per tile: a score row is 4 vectors of 8 floats
constexpr int MR = 3;       // query rows per register block: 3 x 4 accumulators + loads
static_assert(KT == 32, "score rows are handled as 4 vectors of 8");
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// 8 floats (one AVX2 register; two halves of nothing on AVX-512, where the compiler
// still emits 256-bit FMAs): GCC vector extensions keep the register blocks below in
// registers on every x86 level without intrinsics.
typedef float v8 __attribute__((vector_size(32)));
inline v8 load8(const float* p) {
  v8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store8(float* p, v8 v) { std::memcpy(p, &v, sizeof(v)); }
inline v8 splat8(float x) { return v8{x, x, x, x, x, x, x, x}; }

struct Seqs {
  const int32_t* query_start;
  const int32_t* query_len;
  const int32_t* context_len;
  const int32_t* block_table;
  int64_t bt_stride;
  int64_t block_size;
};

// Cache slots of positions [k0, k0 + kn) of a sequence, through its block table.
inline void tile_slots(const int32_t* table, int64_t block_size, int64_t k0, int64_t kn,
                       int64_t* slots) {
  for (int64_t j = 0; j < kn; ++j) {
    const int64_t p = k0 + j;
    slots[j] = static_cast<int64_t>(table[p / block_size]) * block_size + p % block_size;
  }
}

// Per-thread scratch: the tile's queries (pre-scaled), K transposed, V, scores, output
// accumulators and the running max / sum of each of its M = rows * groups query rows.
// The bf16 dot path uses kp / vp / p and rows instead of q / kt / v (see
// prefill_tile_dot); the AMX path has its own (AmxScratch).
struct Scratch {
  std::vector<float> q, kt, v, s, o, mx, sum;
  std::vector<int64_t> slots;
  std::vector<uint32_t> kp, vp, p;  // bf16 pairs
  std::vector<const bf16*> rows;
  Scratch(int64_t m, int64_t d, bool dot)
      : q(dot ? 0 : m * d), kt(dot ? 0 : d * KT), v(dot ? 0 : KT * d), s(m * KT), o(m * d),
        mx(m), sum(m), slots(KT), kp(dot ? d / 2 * KT : 0), vp(dot ? KT / 2 * d : 0),
        p(dot ? m * KT / 2 : 0), rows(dot ? m : 0) {}
};

// s[r][0:KT] = q[r] . kt[:, 0:KT] for R query rows: R x 4 accumulators stay in
// registers while each transposed key row is loaded once for all R rows.
template <int R>
inline void qk_block(const float* q, int64_t d, const float* kt, float* s) {
  v8 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < 4; ++u) acc[r][u] = splat8(0.0f);
  for (int64_t c = 0; c < d; ++c) {
    const float* k = kt + c * KT;
    const v8 k0 = load8(k), k1 = load8(k + 8), k2 = load8(k + 16), k3 = load8(k + 24);
    for (int r = 0; r < R; ++r) {
      const v8 b = splat8(q[r * d + c]);
      acc[r][0] += b * k0;
      acc[r][1] += b * k1;
      acc[r][2] += b * k2;
      acc[r][3] += b * k3;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < 4; ++u) store8(s + r * KT + 8 * u, acc[r][u]);
}

// o[r][c0 : c0 + 8 * NV] += sum_j p[r][j] * v[j][c0 : ...] for R rows.
template <int R, int NV>
inline void pv_block(const float* p, int64_t kn, const float* v, int64_t d, int64_t c0,
                     float* o) {
  v8 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) acc[r][u] = load8(o + r * d + c0 + 8 * u);
  for (int64_t j = 0; j < kn; ++j) {
    v8 vv[NV];
    for (int u = 0; u < NV; ++u) vv[u] = load8(v + j * d + c0 + 8 * u);
    for (int r = 0; r < R; ++r) {
      const v8 b = splat8(p[r * KT + j]);
      for (int u = 0; u < NV; ++u) acc[r][u] += b * vv[u];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) store8(o + r * d + c0 + 8 * u, acc[r][u]);
}

template <int R>
inline void pv_rows(const float* p, int64_t kn, const float* v, int64_t d, float* o) {
  int64_t c0 = 0;
  for (; c0 + 32 <= d; c0 += 32) pv_block<R, 4>(p, kn, v, d, c0, o);
  for (; c0 + 8 <= d; c0 += 8) pv_block<R, 1>(p, kn, v, d, c0, o);
  for (; c0 < d; ++c0)  // head sizes that are not a multiple of 8
    for (int r = 0; r < R; ++r) {
      float a = o[r * d + c0];
      for (int64_t j = 0; j < kn; ++j) a += p[r * KT + j] * v[j * d + c0];
      o[r * d + c0] = a;
    }
}

typedef int32_t v8i __attribute__((vector_size(32)));

// exp_nonpos on 8 lanes: the same 2^n * p(r) split, n rounded to nearest with the
// 1.5 * 2^23 trick (no libm call, so it stays in vector registers).
inline v8 exp8_nonpos(v8 x) {
  const v8 lo = splat8(-87.0f);
  x = x < lo ? lo : x;
  const v8 magic = splat8(12582912.0f);
  const v8 n = (x * splat8(1.44269504088896341f) + magic) - magic;
  const v8 r = (x - n * splat8(0.693145751953125f)) - n * splat8(1.428606765330187e-06f);
  v8 p = splat8(1.0f / 720.0f);
  p = p * r + splat8(1.0f / 120.0f);
  p = p * r + splat8(1.0f / 24.0f);
  p = p * r + splat8(1.0f / 6.0f);
  p = p * r + splat8(0.5f);
  p = p * r + splat8(1.0f);
  p = p * r + splat8(1.0f);
  const v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
  return p * reinterpret_cast<const v8&>(bits);
}

// Masks, exponentiates and folds one score row into its running max and sum; the
// row's earlier output is rescaled. visible: keys of this tile the row may see (the
// rest of the row, padding or above the diagonal, gets probability 0).
inline void online_softmax(float* s, int64_t visible, float& mx, float& sum, float* o,
                           int64_t d) {
  if (visible <= 0) {  // the whole tile lies above this row's diagonal
    std::fill(s, s + KT, 0.0f);
    return;
  }
  for (int64_t j = visible; j < KT; ++j) s[j] = NEG_INF;
  v8 s8[4];
  for (int u = 0; u < 4; ++u) s8[u] = load8(s + 8 * u);
  v8 m8 = s8[0];
  for (int u = 1; u < 4; ++u) m8 = s8[u] > m8 ? s8[u] : m8;
  float tile_max = m8[0];
  for (int l = 1; l < 8; ++l) tile_max = m8[l] > tile_max ? m8[l] : tile_max;
  const float new_max = tile_max > mx ? tile_max : mx;
  const float alpha = mx == NEG_INF ? 0.0f : exp_nonpos(mx - new_max);
  v8 total = splat8(0.0f);
  for (int u = 0; u < 4; ++u) {
    v8 e = exp8_nonpos(s8[u] - splat8(new_max));
    e = s8[u] == splat8(NEG_INF) ? splat8(0.0f) : e;
    store8(s + 8 * u, e);
    total += e;
  }
  float tile_sum = 0.0f;
  for (int l = 0; l < 8; ++l) tile_sum += total[l];
  mx = new_max;
  sum = sum * alpha + tile_sum;
  if (alpha != 1.0f) {
#pragma omp simd
    for (int64_t c = 0; c < d; ++c) o[c] *= alpha;
  }
}

// One tile: rows [r0, r0 + rn) of sequence `i`, the `groups` query heads of KV head kh.
// Row m = r * groups + g is query head kh * groups + g of token r0 + r.
template <typename T>
void prefill_tile(const T* q, int64_t q_stride, const T* kc, const T* vc, const Seqs& sq,
                  int64_t i, int64_t kh, int64_t r0, int64_t rn, int64_t groups, int64_t d,
                  float scale, T* out, int64_t out_stride, Scratch& w) {
  const int64_t ctx = sq.context_len[i], qs = sq.query_start[i];
  const int32_t* table = sq.block_table + i * sq.bt_stride;
  const int64_t m_rows = rn * groups;
  for (int64_t r = 0; r < rn; ++r) {
    const T* qr = q + (qs + r0 + r) * q_stride + kh * groups * d;
    for (int64_t g = 0; g < groups; ++g) {
      float* dst = w.q.data() + (r * groups + g) * d;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) dst[j] = to_f(qr[g * d + j]) * scale;
    }
  }
  std::fill(w.o.begin(), w.o.begin() + m_rows * d, 0.0f);
  std::fill(w.mx.begin(), w.mx.begin() + m_rows, NEG_INF);
  std::fill(w.sum.begin(), w.sum.begin() + m_rows, 0.0f);
  float* kt = w.kt.data();
  float* vv = w.v.data();
  float* sc = w.s.data();
  float* qf = w.q.data();
  float* of = w.o.data();
  const int64_t end = ctx + r0 + rn;  // keys the tile's last row sees
  for (int64_t k0 = 0; k0 < end; k0 += KT) {
    const int64_t kn = std::min(KT, end - k0);
    tile_slots(table, sq.block_size, k0, kn, w.slots.data());
    for (int64_t j = 0; j < kn; ++j) {
      const T* kr = kc + w.slots[j] * d;
      const T* vr = vc + w.slots[j] * d;
      for (int64_t c = 0; c < d; ++c) kt[c * KT + j] = to_f(kr[c]);
#pragma omp simd
      for (int64_t c = 0; c < d; ++c) vv[j * d + c] = to_f(vr[c]);
    }
    if (kn < KT)
      for (int64_t c = 0; c < d; ++c) std::fill(kt + c * KT + kn, kt + c * KT + KT, 0.0f);
    int64_t m = 0;
    for (; m + MR <= m_rows; m += MR) qk_block<MR>(qf + m * d, d, kt, sc + m * KT);
    for (; m < m_rows; ++m) qk_block<1>(qf + m * d, d, kt, sc + m * KT);
    for (m = 0; m < m_rows; ++m) {
      const int64_t visible = std::min(ctx + r0 + m / groups + 1 - k0, kn);
      online_softmax(sc + m * KT, visible, w.mx[m], w.sum[m], of + m * d, d);
    }
    for (m = 0; m + MR <= m_rows; m += MR) pv_rows<MR>(sc + m * KT, kn, vv, d, of + m * d);
    for (; m < m_rows; ++m) pv_rows<1>(sc + m * KT, kn, vv, d, of + m * d);
  }
  for (int64_t r = 0; r < rn; ++r) {
    T* orow = out + (qs + r0 + r) * out_stride + kh * groups * d;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t m = r * groups + g;
      const float inv = 1.0f / w.sum[m];
      const float* om = of + m * d;
      for (int64_t c = 0; c < d; ++c) orow[g * d + c] = from_f<T>(om[c] * inv);
    }
  }
}

#if VLLM_PREFILL_BF16_DOT
// ---- bf16 dot-product path (AVX512-BF16) ----------------------------------------------
//
// `vdpbf16ps acc, a, b` adds a[2i] * b[2i] + a[2i+1] * b[2i+1] to float lane i, so both
// operands are read as pairs of bf16 along the summed index: channel pairs for QK^T,
// key pairs for P.V. Each product broadcasts one pair of the row side (a query row's
// two channels, a probability row's two keys) against a packed vector of the tile side:
//   kp[c/2][j] = (k_j[c], k_j[c+1])            16 keys per vector, KT = 2 vectors
//   vp[j/2][c] = (v_j[c], v_{j+1}[c])          16 channels per vector, d / 16 vectors
// so a tile's keys and values are repacked once per query tile (as the float path
// converts them) and query rows are read in place, unconverted.

constexpr int RQ = 8;  // query rows per QK^T register block: 8 x 2 accumulators
constexpr int RP = 4;  // probability rows per P.V block: 4 x 4 accumulators + 4 loads

inline uint32_t load_pair(const bf16* p) {
  uint32_t u;
  std::memcpy(&u, p, 4);
  return u;
}

inline __m512bh as_bh(__m512i x) { return (__m512bh)x; }

// out[c] = column c of the 16 x 16 matrix of 32-bit words whose rows are r[0..15]
// (unpack within 128-bit lanes, then two rounds of lane shuffles).
inline void transpose16(const __m512i* r, __m512i* out) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // u[4i + e], lane L: rows 4i..4i+3 of column 4L + e
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int e = 0; e < 4; ++e) {
    const __m512i v = _mm512_shuffle_i32x4(u[e], u[4 + e], 0x88);
    const __m512i w = _mm512_shuffle_i32x4(u[e], u[4 + e], 0xdd);
    const __m512i x = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0x88);
    const __m512i y = _mm512_shuffle_i32x4(u[8 + e], u[12 + e], 0xdd);
    out[e] = _mm512_shuffle_i32x4(v, x, 0x88);
    out[8 + e] = _mm512_shuffle_i32x4(v, x, 0xdd);
    out[4 + e] = _mm512_shuffle_i32x4(w, y, 0x88);
    out[12 + e] = _mm512_shuffle_i32x4(w, y, 0xdd);
  }
}

// K rows of the tile's kn keys into channel-pair order, 16 keys by 16 channel pairs
// at a time (a transpose of 32-bit words); keys kn..KT are zero.
inline void pack_k(const bf16* kc, const int64_t* slots, int64_t kn, int64_t d,
                   uint32_t* kp) {
  __m512i rows[16], cols[16];
  for (int64_t h = 0; h < KT; h += 16)
    for (int64_t c = 0; c < d; c += 32) {
      for (int64_t j = 0; j < 16; ++j)
        rows[j] = h + j < kn ? _mm512_loadu_si512(kc + slots[h + j] * d + c)
                             : _mm512_setzero_si512();
      transpose16(rows, cols);
      for (int64_t p = 0; p < 16; ++p)
        _mm512_storeu_si512(kp + (c / 2 + p) * KT + h, cols[p]);
    }
}

// V rows of the tile's keys interleaved in pairs of keys (an odd last key pairs with a
// zero row, never garbage: 0 * NaN would poison the sums).
inline void pack_v(const bf16* vc, const int64_t* slots, int64_t kn, int64_t d,
                   uint32_t* vp) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                      40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33,
                                      1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int64_t j = 0; j < kn; j += 2) {
    const bf16* a = vc + slots[j] * d;
    const bf16* b = j + 1 < kn ? vc + slots[j + 1] * d : nullptr;
    uint32_t* dst = vp + (j / 2) * d;
    for (int64_t c = 0; c < d; c += 32) {
      const __m512i va = _mm512_loadu_si512(a + c);
      const __m512i vb = b ? _mm512_loadu_si512(b + c) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + c, _mm512_permutex2var_epi16(va, lo, vb));
      _mm512_storeu_si512(dst + c + 16, _mm512_permutex2var_epi16(va, hi, vb));
    }
  }
}

// online_softmax for the bf16 paths on a row of raw scores: scales, masks keys at and
// past `visible`, updates the running max and sum (float32, from the unrounded
// probabilities), rescales the row's output and writes the probabilities as 16 bf16
// pairs for P.V. One pass in AVX-512 registers: at the short prompts these paths are
// for, the softmax costs about as much as both products.
inline void softmax_row_bf16(const float* s, int64_t visible, float scale, float& mx,
                             float& sum, float* o, int64_t d, uint32_t* p) {
  if (visible <= 0) {  // the whole tile lies above this row's diagonal
    _mm512_storeu_si512(p, _mm512_setzero_si512());
    return;
  }
  const uint32_t bits = visible >= KT ? ~0u : (1u << visible) - 1u;
  const __mmask16 m0 = static_cast<__mmask16>(bits), m1 = static_cast<__mmask16>(bits >> 16);
  const __m512 sc = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(NEG_INF);
  const __m512 a = _mm512_mask_mul_ps(ninf, m0, _mm512_loadu_ps(s), sc);
  const __m512 b = _mm512_mask_mul_ps(ninf, m1, _mm512_loadu_ps(s + 16), sc);
  const float tile_max = _mm512_reduce_max_ps(_mm512_max_ps(a, b));
  const float new_max = tile_max > mx ? tile_max : mx;
  const float alpha = mx == NEG_INF ? 0.0f : exp_nonpos(mx - new_max);
  const __m512 nm = _mm512_set1_ps(new_max);
  const __m512 ea = _mm512_maskz_mov_ps(m0, exp16_nonpos(_mm512_sub_ps(a, nm)));
  const __m512 eb = _mm512_maskz_mov_ps(m1, exp16_nonpos(_mm512_sub_ps(b, nm)));
  mx = new_max;
  sum = sum * alpha + _mm512_reduce_add_ps(_mm512_add_ps(ea, eb));
  if (alpha != 1.0f) {
    const __m512 al = _mm512_set1_ps(alpha);
    for (int64_t c = 0; c < d; c += 16)  // d % 32 == 0 on these paths
      _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), al));
  }
  _mm512_storeu_si512(p, (__m512i)_mm512_cvtne2ps_pbh(eb, ea));
}

// s[r][0:KT] = q_r . k[0:KT] for R query rows read in place (unscaled: the softmax
// scales, so q is not rounded again).
template <int R>
inline void qk_dot(const bf16* const* rows, int64_t d, const uint32_t* kp, float* s) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t c = 0; c < d / 2; ++c) {
    const __m512bh k0 = as_bh(_mm512_loadu_si512(kp + c * KT));
    const __m512bh k1 = as_bh(_mm512_loadu_si512(kp + c * KT + 16));
    for (int r = 0; r < R; ++r) {
      const __m512bh b = as_bh(_mm512_set1_epi32(load_pair(rows[r] + 2 * c)));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], k0, b);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], k1, b);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_storeu_ps(s + r * KT, acc[r][0]);
    _mm512_storeu_ps(s + r * KT + 16, acc[r][1]);
  }
}

// o[r][c0 : c0 + 16 * NV] += sum_j p[r][j] v[j][...] over `pairs` key pairs.
template <int R, int NV>
inline void pv_dot(const uint32_t* p, int64_t pairs, const uint32_t* vp, int64_t d,
                   int64_t c0, float* o) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) acc[r][u] = _mm512_loadu_ps(o + r * d + c0 + 16 * u);
  for (int64_t jp = 0; jp < pairs; ++jp) {
    __m512bh vv[NV];
    for (int u = 0; u < NV; ++u)
      vv[u] = as_bh(_mm512_loadu_si512(vp + jp * d + c0 + 16 * u));
    for (int r = 0; r < R; ++r) {
      const __m512bh b = as_bh(_mm512_set1_epi32(p[r * (KT / 2) + jp]));
      for (int u = 0; u < NV; ++u) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], vv[u], b);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) _mm512_storeu_ps(o + r * d + c0 + 16 * u, acc[r][u]);
}

template <int R>
inline void pv_dot_rows(const uint32_t* p, int64_t pairs, const uint32_t* vp, int64_t d,
                        float* o) {
  int64_t c0 = 0;
  for (; c0 + 64 <= d; c0 += 64) pv_dot<R, 4>(p, pairs, vp, d, c0, o);
  for (; c0 < d; c0 += 32) pv_dot<R, 2>(p, pairs, vp, d, c0, o);  // d % 32 == 0
}

// Rows [m, m_rows) of the QK^T product in blocks of RQ, the tail one block of its size.
inline void qk_dot_rows(const bf16* const* rows, int64_t m_rows, int64_t d,
                        const uint32_t* kp, float* s) {
  int64_t m = 0;
  for (; m + RQ <= m_rows; m += RQ) qk_dot<RQ>(rows + m, d, kp, s + m * KT);
  switch (m_rows - m) {
    case 7: qk_dot<7>(rows + m, d, kp, s + m * KT); break;
    case 6: qk_dot<6>(rows + m, d, kp, s + m * KT); break;
    case 5: qk_dot<5>(rows + m, d, kp, s + m * KT); break;
    case 4: qk_dot<4>(rows + m, d, kp, s + m * KT); break;
    case 3: qk_dot<3>(rows + m, d, kp, s + m * KT); break;
    case 2: qk_dot<2>(rows + m, d, kp, s + m * KT); break;
    case 1: qk_dot<1>(rows + m, d, kp, s + m * KT); break;
    default: break;
  }
}

// prefill_tile for bf16 with d % 32 == 0, on bf16 dot products (same tiling, masking and
// online softmax; see the comment above pack_k for the layouts).
void prefill_tile_dot(const bf16* q, int64_t q_stride, const bf16* kc, const bf16* vc,
                      const Seqs& sq, int64_t i, int64_t kh, int64_t r0, int64_t rn,
                      int64_t groups, int64_t d, float scale, bf16* out, int64_t out_stride,
                      Scratch& w) {
  const int64_t ctx = sq.context_len[i], qs = sq.query_start[i];
  const int32_t* table = sq.block_table + i * sq.bt_stride;
  const int64_t m_rows = rn * groups;
  for (int64_t r = 0; r < rn; ++r)
    for (int64_t g = 0; g < groups; ++g)
      w.rows[r * groups + g] = q + (qs + r0 + r) * q_stride + (kh * groups + g) * d;
  std::fill(w.o.begin(), w.o.begin() + m_rows * d, 0.0f);
  std::fill(w.mx.begin(), w.mx.begin() + m_rows, NEG_INF);
  std::fill(w.sum.begin(), w.sum.begin() + m_rows, 0.0f);
  float* sc = w.s.data();
  float* of = w.o.data();
  uint32_t* pb = w.p.data();
  const int64_t end = ctx + r0 + rn;  // keys the tile's last row sees
  for (int64_t k0 = 0; k0 < end; k0 += KT) {
    const int64_t kn = std::min(KT, end - k0);
    tile_slots(table, sq.block_size, k0, kn, w.slots.data());
    pack_k(kc, w.slots.data(), kn, d, w.kp.data());
    pack_v(vc, w.slots.data(), kn, d, w.vp.data());
    qk_dot_rows(w.rows.data(), m_rows, d, w.kp.data(), sc);
    for (int64_t m = 0; m < m_rows; ++m) {
      const int64_t visible = std::min(ctx + r0 + m / groups + 1 - k0, kn);
      softmax_row_bf16(sc + m * KT, visible, scale, w.mx[m], w.sum[m], of + m * d, d,
                       pb + m * (KT / 2));
    }
    const int64_t pairs = (kn + 1) / 2;
    const uint32_t* vp = w.vp.data();
    int64_t m = 0;
    for (; m + RP <= m_rows; m += RP)
      pv_dot_rows<RP>(pb + m * (KT / 2), pairs, vp, d, of + m * d);
    for (; m < m_rows; ++m) pv_dot_rows<1>(pb + m * (KT / 2), pairs, vp, d, of + m * d);
  }
  for (int64_t r = 0; r < rn; ++r) {
    bf16* orow = out + (qs + r0 + r) * out_stride + kh * groups * d;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t m = r * groups + g;
      const float inv = 1.0f / w.sum[m];
      const float* om = of + m * d;
      for (int64_t c = 0; c < d; ++c) orow[g * d + c] = from_f<bf16>(om[c] * inv);
    }
  }
}
#endif  // VLLM_PREFILL_BF16_DOT

#if VLLM_PREFILL_AMX
// ---- AMX path (Sapphire Rapids and later) ---------------------------------------------
//
// `tdpbf16ps` multiplies a 16 x 32 bf16 tile by a 32 x 16 one held as 16 rows of pairs,
// into a 16 x 16 float32 tile: 8192 multiply-adds per instruction. Unlike the paths
// above, this one packs each sequence's keys and values once per call, before any
// tile runs, into the operand layouts of that instruction:
//   kp: per 16 keys, [d/2 channel pairs][16 keys] pairs: a 16-key by 32-channel B
//       operand of QK^T is a tile of stride 64 bytes;
//   vp: [key pairs][d channels] pairs: a 32-key by 16-channel B operand of P.V is a
//       tile of stride 4 * d bytes.
// A query tile (16 rows, each of the group's heads one 16-row A operand, read in place
// from the query tensor when the tile is full) then walks its keys in blocks of KB:
// QK^T into a float32 score block, one AVX-512 softmax pass per row over the block
// (running max and sum, probabilities rounded to bf16), P.V into fresh accumulator
// tiles, folded into the float32 output rows as o = o * alpha + PV. Blocks of KB keys
// (not the 32 of the paths above) because every hand-over between the tile unit and
// the vector unit goes through memory: per 32 keys, those stalls cost more than both
// products (a profile of the 32-key version spent most of its time waiting on tile
// loads of rows the vector unit had just written).
// Linux lends a process the AMX state only after it asks (arch_prctl); when it refuses,
// the AVX512-BF16 path runs instead.

constexpr int kTileRows = 16;
constexpr int64_t KB = 256;  // keys per block: a multiple of 32 (P.V's key operand)
// (64, 128 and 256 measured on a 2-core Xeon: 256 was fastest at 128-512 tokens).

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Every tile 16 rows of 64 bytes: tmm0 the A operand, tmm1 / tmm2 B operands (two so a
// load does not wait for the product reading the other), tmm4-7 accumulators.
inline void load_tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = kTileRows;
  }
  _tile_loadconfig(&cfg);
}

bool amx_permitted() {
  static const bool ok = [] {
    constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

// Keys [k0, k0 + 32) of one sequence (its `len` keys, the rest zero) into kp / vp.
inline void pack_chunk_amx(const bf16* kc, const bf16* vc, const int32_t* table,
                           int64_t block_size, int64_t k0, int64_t len, int64_t d,
                           uint32_t* kp, uint32_t* vp) {
  int64_t slots[32];
  const int64_t kn = std::min<int64_t>(32, len - k0);
  tile_slots(table, block_size, k0, kn, slots);
  __m512i rows[16], cols[16];
  for (int64_t h = 0; h < 32; h += 16) {
    uint32_t* dst = kp + (k0 + h) * (d / 2);  // this 16-key group's [d/2][16]
    for (int64_t c = 0; c < d; c += 32) {
      for (int64_t j = 0; j < 16; ++j)
        rows[j] = h + j < kn ? _mm512_loadu_si512(kc + slots[h + j] * d + c)
                             : _mm512_setzero_si512();
      transpose16(rows, cols);
      for (int64_t p = 0; p < 16; ++p) _mm512_storeu_si512(dst + (c / 2 + p) * 16, cols[p]);
    }
  }
  pack_v(vc, slots, kn, d, vp + (k0 / 2) * d);
  const int64_t pairs = (kn + 1) / 2;
  std::fill(vp + (k0 / 2 + pairs) * d, vp + (k0 / 2 + 16) * d, 0u);
}

// Per-thread buffers of a query tile: M = 16 * groups rows, row m = g * 16 + r.
struct AmxScratch {
  std::vector<bf16> qb, p;              // [M][d] padded queries, [M][KB] probabilities
  std::vector<float> s, o, pv, mx, sum, alpha;
  AmxScratch(int64_t m, int64_t d)
      : qb(m * d), p(m * KB), s(m * KB), o(m * d), pv(m * d), mx(m), sum(m), alpha(m) {}
};

// Softmax of score row m over `kn` keys of a block, `visible` of them unmasked: the
// running max and sum, alpha (what the row's earlier output is multiplied by) and the
// bf16 probabilities, zero from `visible` up to the block's 32-key end.
inline void softmax_block_amx(const float* s, int64_t kn, int64_t visible, float scale,
                              float& mx, float& sum, float& alpha, bf16* p) {
  const int64_t width = (kn + 31) / 32 * 32;
  if (visible <= 0) {
    std::fill(p, p + width, bf16{0});
    alpha = 1.0f;
    return;
  }
  const __m512 sc = _mm512_set1_ps(scale);
  __m512 vmax = _mm512_set1_ps(NEG_INF);
  for (int64_t j = 0; j < visible; j += 16) {
    const __mmask16 m = visible - j >= 16 ? 0xffff : (1u << (visible - j)) - 1u;
    vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, s + j));
  }
  const float block_max = _mm512_reduce_max_ps(vmax) * scale;
  const float new_max = block_max > mx ? block_max : mx;
  alpha = mx == NEG_INF ? 0.0f : exp_nonpos(mx - new_max);
  const __m512 nm = _mm512_set1_ps(new_max);
  __m512 total = _mm512_setzero_ps();
  for (int64_t j = 0; j < width; j += 32) {
    __m512 e[2];
    for (int h = 0; h < 2; ++h) {
      const int64_t left = visible - j - 16 * h;
      const __mmask16 m = left >= 16 ? 0xffff : left <= 0 ? 0 : (1u << left) - 1u;
      const __m512 x = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(m, s + j + 16 * h), sc, nm);
      e[h] = _mm512_maskz_mov_ps(m, exp16_nonpos(x));
      total = _mm512_add_ps(total, e[h]);
    }
    _mm512_storeu_si512(p + j, (__m512i)_mm512_cvtne2ps_pbh(e[1], e[0]));
  }
  mx = new_max;
  sum = sum * alpha + _mm512_reduce_add_ps(total);
}

// QK^T of one block: s[g * 16 + r][0 : 16 * nt] for every head g of the group, nt 16-key
// tiles of kp (the block's first key group). Up to four accumulators per pass.
inline void qk_block_amx(const bf16* const* qa, int64_t qa_stride, int64_t groups, int64_t d,
                         const uint32_t* kp, int64_t nt, float* s) {
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t n0 = 0; n0 < nt; n0 += 4) {
      const int64_t nb = std::min<int64_t>(4, nt - n0);
      _tile_zero(4);
      _tile_zero(5);
      _tile_zero(6);
      _tile_zero(7);
      const uint32_t* kt = kp + n0 * 16 * (d / 2);
      for (int64_t c = 0; c < d; c += 32) {
        _tile_loadd(0, qa[g] + c, qa_stride);
        const uint32_t* b = kt + (c / 2) * 16;
        _tile_loadd(1, b, 64);
        _tile_dpbf16ps(4, 0, 1);
        if (nb > 1) {
          _tile_loadd(2, b + 16 * (d / 2), 64);
          _tile_dpbf16ps(5, 0, 2);
        }
        if (nb > 2) {
          _tile_loadd(1, b + 32 * (d / 2), 64);
          _tile_dpbf16ps(6, 0, 1);
        }
        if (nb > 3) {
          _tile_loadd(2, b + 48 * (d / 2), 64);
          _tile_dpbf16ps(7, 0, 2);
        }
      }
      float* sg = s + g * kTileRows * KB + n0 * 16;
      _tile_stored(4, sg, KB * 4);
      if (nb > 1) _tile_stored(5, sg + 16, KB * 4);
      if (nb > 2) _tile_stored(6, sg + 32, KB * 4);
      if (nb > 3) _tile_stored(7, sg + 48, KB * 4);
    }
}

// P.V of one block: pv[g * 16 + r][0 : d] = p rows times `chunks` 32-key chunks of vp
// (the block's first key pair), 64 output channels per pass.
inline void pv_block_amx(const bf16* p, int64_t groups, int64_t d, const uint32_t* vp,
                         int64_t chunks, float* pv) {
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t c0 = 0; c0 < d; c0 += 64) {
      const bool four = c0 + 64 <= d;  // else 32 channels (d % 32 == 0)
      _tile_zero(4);
      _tile_zero(5);
      _tile_zero(6);
      _tile_zero(7);
      for (int64_t ch = 0; ch < chunks; ++ch) {
        _tile_loadd(0, p + g * kTileRows * KB + ch * 32, KB * 2);
        const uint32_t* b = vp + ch * 16 * d + c0;
        _tile_loadd(1, b, d * 4);
        _tile_dpbf16ps(4, 0, 1);
        _tile_loadd(2, b + 16, d * 4);
        _tile_dpbf16ps(5, 0, 2);
        if (four) {
          _tile_loadd(1, b + 32, d * 4);
          _tile_dpbf16ps(6, 0, 1);
          _tile_loadd(2, b + 48, d * 4);
          _tile_dpbf16ps(7, 0, 2);
        }
      }
      float* o = pv + g * kTileRows * d + c0;
      _tile_stored(4, o, d * 4);
      _tile_stored(5, o + 16, d * 4);
      if (four) {
        _tile_stored(6, o + 32, d * 4);
        _tile_stored(7, o + 48, d * 4);
      }
    }
}

// Query rows [r0, r0 + rn) of sequence i, heads of KV head kh; kp / vp its packed keys.
void prefill_tile_amx(const bf16* q, int64_t q_stride, const uint32_t* kp,
                      const uint32_t* vp, const Seqs& sq, int64_t i, int64_t kh, int64_t r0,
                      int64_t rn, int64_t groups, int64_t d, float scale, bf16* out,
                      int64_t out_stride, AmxScratch& w) {
  const int64_t ctx = sq.context_len[i], qs = sq.query_start[i];
  const int64_t m_rows = groups * kTileRows;
  const bf16* qa[16];
  int64_t qa_stride = q_stride * 2;
  for (int64_t g = 0; g < groups; ++g)
    qa[g] = q + (qs + r0) * q_stride + (kh * groups + g) * d;
  if (rn < kTileRows) {  // a 16-row operand must not read past the prompt's rows
    for (int64_t g = 0; g < groups; ++g) {
      bf16* dst = w.qb.data() + g * kTileRows * d;
      for (int64_t r = 0; r < kTileRows; ++r) {
        if (r < rn)
          std::memcpy(dst + r * d, qa[g] + r * q_stride, d * 2);
        else
          std::fill(dst + r * d, dst + (r + 1) * d, bf16{0});
      }
      qa[g] = dst;
    }
    qa_stride = d * 2;
  }
  std::fill(w.o.begin(), w.o.begin() + m_rows * d, 0.0f);
  std::fill(w.mx.begin(), w.mx.end(), NEG_INF);
  std::fill(w.sum.begin(), w.sum.end(), 0.0f);
  const int64_t end = ctx + r0 + rn;  // keys the tile's last row sees
  for (int64_t k0 = 0; k0 < end; k0 += KB) {
    const int64_t kn = std::min(KB, end - k0);
    qk_block_amx(qa, qa_stride, groups, d, kp + k0 * (d / 2), (kn + 15) / 16, w.s.data());
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t r = 0; r < kTileRows; ++r) {
        const int64_t m = g * kTileRows + r;
        const int64_t visible = r < rn ? std::min(ctx + r0 + r + 1 - k0, kn) : 0;
        softmax_block_amx(w.s.data() + m * KB, kn, visible, scale, w.mx[m], w.sum[m],
                          w.alpha[m], w.p.data() + m * KB);
      }
    pv_block_amx(w.p.data(), groups, d, vp + (k0 / 2) * d, (kn + 31) / 32, w.pv.data());
    for (int64_t m = 0; m < m_rows; ++m) {
      const __m512 al = _mm512_set1_ps(w.alpha[m]);
      float* o = w.o.data() + m * d;
      const float* add = w.pv.data() + m * d;
      for (int64_t c = 0; c < d; c += 16)
        _mm512_storeu_ps(o + c, _mm512_fmadd_ps(_mm512_loadu_ps(o + c), al,
                                                _mm512_loadu_ps(add + c)));
    }
  }
  for (int64_t r = 0; r < rn; ++r) {
    bf16* orow = out + (qs + r0 + r) * out_stride + kh * groups * d;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t m = g * kTileRows + r;
      const float inv = 1.0f / w.sum[m];
      const float* om = w.o.data() + m * d;
      for (int64_t c = 0; c < d; ++c) orow[g * d + c] = from_f<bf16>(om[c] * inv);
    }
  }
}

// The whole call on AMX: pack every sequence's keys and values, then the query tiles.
void prefill_attention_amx(const bf16* q, int64_t q_stride, const bf16* k_cache,
                           const bf16* v_cache, int64_t num_slots, const Seqs& sq,
                           int64_t num_seqs, int64_t hq, int64_t hkv, int64_t d, float scale,
                           bf16* out, int64_t out_stride, int nthreads) {
  const int64_t groups = hq / hkv;
  // off[i]: sequence i's first key in the packed buffers (lengths rounded up to 32).
  std::vector<int64_t> off(num_seqs + 1, 0), chunks, items;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t len = sq.context_len[i] + sq.query_len[i];
    off[i + 1] = off[i] + (len + 31) / 32 * 32;
    for (int64_t c = 0; c < len; c += 32) {
      chunks.push_back(i);
      chunks.push_back(c);
    }
    for (int64_t t = (sq.query_len[i] + QT - 1) / QT - 1; t >= 0; --t) {
      items.push_back(i);
      items.push_back(t);
    }
  }
  const int64_t total = off[num_seqs];
  // Reused across calls (a step calls once per layer): no allocation, no page faults.
  // It holds a copy of the call's keys and values (4 bytes per key and channel of each
  // KV head), so it stays as large as the largest call's context since.
  thread_local std::vector<uint32_t> kbuf, vbuf;
  const size_t need = static_cast<size_t>(hkv * total * (d / 2));
  if (kbuf.size() < need) {
    kbuf.resize(need);
    vbuf.resize(need);
  }
  uint32_t* kp_all = kbuf.data();
  uint32_t* vp_all = vbuf.data();
  const int64_t n_chunks = static_cast<int64_t>(chunks.size()) / 2 * hkv;
  const int64_t n_items = static_cast<int64_t>(items.size()) / 2 * hkv;
#pragma omp parallel num_threads(nthreads) if (n_items > 1)
  {
#pragma omp for schedule(static)
    for (int64_t it = 0; it < n_chunks; ++it) {
      const int64_t pair = it / hkv, kh = it % hkv;
      const int64_t i = chunks[2 * pair], k0 = chunks[2 * pair + 1];
      const int64_t base = (kh * total + off[i]) * (d / 2);
      pack_chunk_amx(k_cache + kh * num_slots * d, v_cache + kh * num_slots * d,
                     sq.block_table + i * sq.bt_stride, sq.block_size, k0,
                     sq.context_len[i] + sq.query_len[i], d, kp_all + base, vp_all + base);
    }
    AmxScratch w(kTileRows * groups, d);
    load_tile_config();  // per thread: tile state is a thread's
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      const int64_t pair = it / hkv, kh = it % hkv;
      const int64_t i = items[2 * pair], r0 = items[2 * pair + 1] * QT;
      const int64_t rn = std::min(QT, static_cast<int64_t>(sq.query_len[i]) - r0);
      const int64_t base = (kh * total + off[i]) * (d / 2);
      prefill_tile_amx(q, q_stride, kp_all + base, vp_all + base, sq, i, kh, r0, rn, groups,
                       d, scale, out, out_stride, w);
    }
    _tile_release();
  }
}
#endif  // VLLM_PREFILL_AMX

// bf16 kernels, slowest to fastest; a call asks for one and gets the best this build
// and process have up to it.
enum Bf16Kernel { kFma = 0, kDot = 1, kAmx = 2 };

int best_bf16_kernel() {
#if VLLM_PREFILL_AMX
  if (amx_permitted()) return kAmx;
#endif
  return VLLM_PREFILL_BF16_DOT ? kDot : kFma;
}

// The kernel this call runs: float32 models and head sizes not a multiple of 32 keep
// the float32 path; the AMX path holds at most 16 query heads per KV head.
template <typename T>
inline int kernel_for(int64_t d, int64_t groups, int asked) {
  if (!std::is_same<T, bf16>::value || d % 32 != 0) return kFma;
  const int best = std::min(asked, best_bf16_kernel());
  return best == kAmx && groups > 16 ? kDot : best;
}

template <typename T>
void run_tile(int kernel, const T* q, int64_t q_stride, const T* kc, const T* vc,
              const Seqs& sq, int64_t i, int64_t kh, int64_t r0, int64_t rn, int64_t groups,
              int64_t d, float scale, T* out, int64_t out_stride, Scratch& w) {
#if VLLM_PREFILL_BF16_DOT
  if constexpr (std::is_same<T, bf16>::value) {
    if (kernel == kDot) {
      prefill_tile_dot(q, q_stride, kc, vc, sq, i, kh, r0, rn, groups, d, scale, out,
                       out_stride, w);
      return;
    }
  }
#endif
  prefill_tile<T>(q, q_stride, kc, vc, sq, i, kh, r0, rn, groups, d, scale, out, out_stride,
                  w);
}

template <typename T>
void prefill_attention(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache,
                       int64_t num_slots, const Seqs& sq, int64_t num_seqs, int64_t hq,
                       int64_t hkv, int64_t d, float scale, T* out, int64_t out_stride,
                       int nthreads, int asked) {
  const int64_t groups = hq / hkv;
  const int kernel = kernel_for<T>(d, groups, asked);
#if VLLM_PREFILL_AMX
  if constexpr (std::is_same<T, bf16>::value) {
    if (kernel == kAmx) {
      prefill_attention_amx(q, q_stride, k_cache, v_cache, num_slots, sq, num_seqs, hq, hkv,
                            d, scale, out, out_stride, nthreads);
      return;
    }
  }
#endif
  // Work items (sequence, KV head, query tile), longest-context tiles first so the
  // dynamic schedule ends with the cheap ones.
  std::vector<int64_t> items;  // packed: seq, tile
  for (int64_t i = 0; i < num_seqs; ++i)
    for (int64_t t = (sq.query_len[i] + QT - 1) / QT - 1; t >= 0; --t) {
      items.push_back(i);
      items.push_back(t);
    }
  const int64_t n_items = static_cast<int64_t>(items.size()) / 2 * hkv;
#pragma omp parallel num_threads(nthreads) if (n_items > 1)
  {
    Scratch w(QT * groups, d, kernel != kFma);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      const int64_t pair = it / hkv, kh = it % hkv;
      const int64_t i = items[2 * pair], r0 = items[2 * pair + 1] * QT;
      const int64_t rn = std::min(QT, static_cast<int64_t>(sq.query_len[i]) - r0);
      run_tile<T>(kernel, q, q_stride, k_cache + kh * num_slots * d,
                  v_cache + kh * num_slots * d, sq, i, kh, r0, rn, groups, d, scale, out,
                  out_stride, w);
    }
  }
}

}  // namespace

extern "C" {

int vllm_prefill_ops_version() { return 3; }

// The fastest kernel bf16 calls with head sizes that are a multiple of 32 can take:
// 0 float32 FMAs, 1 AVX512-BF16 dot products, 2 AMX tiles (built for AMX and the
// kernel lent this process the tile state).
int vllm_prefill_bf16_kernel() { return best_bf16_kernel(); }

// bf16_kernel: the fastest kernel a bf16 call may take (lower ones let tests and
// benchmarks compare the paths on one machine); float32 calls ignore it.

void vllm_prefill_attention(int dtype, const void* q, int64_t q_stride, const void* k_cache,
                            const void* v_cache, int64_t num_slots,
                            const int32_t* block_table, int64_t bt_stride,
                            const int32_t* query_start, const int32_t* query_len,
                            const int32_t* context_len, int64_t num_seqs, int64_t hq,
                            int64_t hkv, int64_t d, int64_t block_size, float scale,
                            void* out, int64_t out_stride, int nthreads,
                            int bf16_kernel) {
  const Seqs sq{query_start, query_len, context_len, block_table, bt_stride, block_size};
  if (dtype == 0)
    prefill_attention<float>(static_cast<const float*>(q), q_stride,
                             static_cast<const float*>(k_cache),
                             static_cast<const float*>(v_cache), num_slots, sq, num_seqs, hq,
                             hkv, d, scale, static_cast<float*>(out), out_stride, nthreads,
                             kFma);
  else
    prefill_attention<bf16>(static_cast<const bf16*>(q), q_stride,
                            static_cast<const bf16*>(k_cache),
                            static_cast<const bf16*>(v_cache), num_slots, sq, num_seqs, hq,
                            hkv, d, scale, static_cast<bf16*>(out), out_stride, nthreads,
                            bf16_kernel);
}

}  // extern "C"
