// CPU kernels for the decode hot path, called through ctypes (see loader.py).
//
// Why plain C ABI and raw pointers: building against the torch headers takes about a
// minute on a small machine; this file compiles in a few seconds with the system
// compiler, once, and is cached. The Python wrappers in cpu_ops.py check shapes,
// dtypes and strides before calling; every kernel here trusts its arguments.
//
// Each kernel replaces a chain of small torch ops (each a dispatch, an allocation and
// a pass over memory) whose fixed costs dominate a decode step of a small model.
// Numerics follow the Hugging Face reference: statistics and sums in float32, results
// rounded to the model dtype at the same points as the reference rounds.
//
// Threads: OpenMP. The library links libgomp by its soname, which torch has already
// loaded, so these loops run on torch's own thread pool. `nthreads` is passed in
// (torch.get_num_threads()) because the OpenMP default is per calling thread.
//
// dtype codes: 0 = float32, 1 = bfloat16 (stored as uint16_t); KV caches also
// 2 = float8_e4m3fn, 3 = float8_e5m2 (one byte, decoded through a 256-entry table).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "vec_math.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#define VLLM_HAVE_AVX512 1
#else
#define VLLM_HAVE_AVX512 0
#endif

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define VLLM_HAVE_BF16_GEMM 1
#else
#define VLLM_HAVE_BF16_GEMM 0
#endif

// The packed bf16 GEMM exists in two builds: bf16 dot products (AVX512-BF16), or bf16
// weights widened to float32 in registers and summed with FMA (AVX2, any x86 server of
// the last decade). Both read the same packed layout.
#if VLLM_HAVE_BF16_GEMM || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#include <omp.h>
#define VLLM_HAVE_PACKED_GEMM 1
#else
#define VLLM_HAVE_PACKED_GEMM 0
#endif

// AMX tiles (Sapphire Rapids and later) read the same packed layout: see gemm_amx.
#if VLLM_HAVE_BF16_GEMM && defined(__AMX_TILE__) && defined(__AMX_BF16__) && \
    defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define VLLM_HAVE_AMX_GEMM 1
#else
#define VLLM_HAVE_AMX_GEMM 0
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

// fp8 KV cache elements. Reading one is a lookup in a 256-entry float table: exact,
// NaN-preserving, and the same code for both formats; the per-tensor scales are
// applied outside the token loops (K's folded into the softmax scale, V's into the
// output), so the loops see the raw fp8 values.
struct fp8_e4m3 { uint8_t bits; };
struct fp8_e5m2 { uint8_t bits; };

// Value of an fp8 byte with `mbits` mantissa bits and exponent bias `bias`; `ieee`:
// e5m2 keeps IEEE infinities and NaNs at the top exponent, e4m3fn has only NaN at
// S.1111.111 (its top exponent holds normal numbers).
inline float decode_fp8(uint8_t b, int mbits, int bias, bool ieee) {
  const int ebits = 7 - mbits;
  const int e = (b >> mbits) & ((1 << ebits) - 1), m = b & ((1 << mbits) - 1);
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int top = (1 << ebits) - 1;
  if (ieee && e == top) return m ? NAN : sign * INFINITY;
  if (!ieee && e == top && m == (1 << mbits) - 1) return NAN;
  const float frac = static_cast<float>(m) / static_cast<float>(1 << mbits);
  return sign * (e ? std::ldexp(1.0f + frac, e - bias) : std::ldexp(frac, 1 - bias));
}

struct Fp8Tables {
  float e4m3[256], e5m2[256];
  Fp8Tables() {
    for (int b = 0; b < 256; ++b) {
      e4m3[b] = decode_fp8(static_cast<uint8_t>(b), 3, 7, false);
      e5m2[b] = decode_fp8(static_cast<uint8_t>(b), 2, 15, true);
    }
  }
};
const Fp8Tables kFp8;

inline float to_f(fp8_e4m3 x) { return kFp8.e4m3[x.bits]; }
inline float to_f(fp8_e5m2 x) { return kFp8.e5m2[x.bits]; }
inline const float* fp8_table(const fp8_e4m3*) { return kFp8.e4m3; }
inline const float* fp8_table(const fp8_e5m2*) { return kFp8.e5m2; }

template <typename T> inline T from_f(float x);
template <> inline float from_f<float>(float x) { return x; }
// Round to nearest even, as torch converts float to bfloat16 (NaN stays a NaN).
template <> inline bf16 from_f<bf16>(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16>(u >> 16);
}

// Rounds a float to the storage dtype and back (the reference's intermediate roundings).
template <typename T> inline float round_to(float x) { return to_f(from_f<T>(x)); }

// exp(x) for x <= 0 (softmax after max subtraction, silu's exp(-|g|)): written without
// libm so the compiler vectorizes loops that call it. 2^n * p(r), r in [-ln2/2, ln2/2],
// degree-6 Taylor polynomial: relative error below 2e-7 (float rounding level).
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

#if VLLM_HAVE_BF16_GEMM
// bf16 rows as float vectors, and float vectors rounded to bf16 (nearest even, NaN
// kept) in one instruction; used by the AVX512-BF16 versions of the elementwise kernels.
inline __m512 bf16x16_to_f(const bf16* p, __mmask16 m) {
  const __m256i raw = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m256i f_to_bf16x16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }
inline __m512 round_bf16(__m512 v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(f_to_bf16x16(v)), 16));
}
inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? 0xffff : static_cast<__mmask16>((1u << left) - 1);
}
#endif

// ------------------------------------------------------------------ RMSNorm
// With a residual: residual <- x + residual (rounded to T), then the norm of that sum.
// out may alias x. out = T(w * T(h * rsqrt(mean(h^2) + eps))), the reference's order.
#if VLLM_HAVE_BF16_GEMM
// rms_norm for bf16: the same roundings, 16 features per instruction.
void rms_norm_bf16(bf16* x, int64_t x_stride, bf16* residual, int64_t res_stride,
                   const bf16* w, bf16* out, int64_t out_stride, int64_t rows, int64_t d,
                   float eps, int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (rows * d >= 65536) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    bf16* xr = x + i * x_stride;
    bf16* o = out + i * out_stride;
    const bf16* h = xr;
    __m512 ss = _mm512_setzero_ps();
    if (residual != nullptr) {
      bf16* rr = residual + i * res_stride;
      for (int64_t j = 0; j < d; j += 16) {
        const __mmask16 m = tail_mask(d - j);
        const __m512 sum = round_bf16(_mm512_add_ps(bf16x16_to_f(xr + j, m),
                                                     bf16x16_to_f(rr + j, m)));
        _mm256_mask_storeu_epi16(rr + j, m, f_to_bf16x16(sum));
        ss = _mm512_fmadd_ps(sum, sum, ss);
      }
      h = rr;
    } else {
      for (int64_t j = 0; j < d; j += 16) {
        const __m512 v = bf16x16_to_f(h + j, tail_mask(d - j));
        ss = _mm512_fmadd_ps(v, v, ss);
      }
    }
    const float rs = 1.0f / std::sqrt(_mm512_reduce_add_ps(ss) / static_cast<float>(d) + eps);
    const __m512 vrs = _mm512_set1_ps(rs);
    for (int64_t j = 0; j < d; j += 16) {
      const __mmask16 m = tail_mask(d - j);
      const __m512 normed = round_bf16(_mm512_mul_ps(bf16x16_to_f(h + j, m), vrs));
      _mm256_mask_storeu_epi16(o + j, m,
                               f_to_bf16x16(_mm512_mul_ps(bf16x16_to_f(w + j, m), normed)));
    }
  }
}
#endif

template <typename T>
void rms_norm(T* x, int64_t x_stride, T* residual, int64_t res_stride, const T* w, T* out,
              int64_t out_stride, int64_t rows, int64_t d, float eps, int nthreads) {
#if VLLM_HAVE_BF16_GEMM
  if constexpr (std::is_same_v<T, bf16>) {
    rms_norm_bf16(x, x_stride, residual, res_stride, w, out, out_stride, rows, d, eps,
                  nthreads);
    return;
  }
#endif
#pragma omp parallel for num_threads(nthreads) if (rows * d >= 65536) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    T* xr = x + i * x_stride;
    T* o = out + i * out_stride;
    const T* h = xr;
    if (residual != nullptr) {
      T* rr = residual + i * res_stride;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) rr[j] = from_f<T>(to_f(xr[j]) + to_f(rr[j]));
      h = rr;
    }
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < d; ++j) {
      const float v = to_f(h[j]);
      ss += v * v;
    }
    const float rs = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
#pragma omp simd
    for (int64_t j = 0; j < d; ++j)
      o[j] = from_f<T>(to_f(w[j]) * round_to<T>(to_f(h[j]) * rs));
  }
}

// ------------------------------------------------------------------ rotary
// Rotates the first `rot_dim` features of heads [0, num_heads) of every row, in place.
// cos_sin: [max_pos, rot_dim] rows of [cos | sin] (rot_dim / 2 each), dtype T.
// neox: halves (x1, x2) -> (x1 c - x2 s, x2 c + x1 s); else interleaved pairs.
// Each product is rounded to T before the sum, as `q * cos + rotate_half(q) * sin`.
template <typename T>
void rotary(T* x, int64_t rows, int64_t row_stride, int64_t num_heads, int64_t head_size,
            int64_t rot_dim, const int64_t* pos, const T* cos_sin, int neox, int nthreads) {
  const int64_t half = rot_dim / 2;
#pragma omp parallel for num_threads(nthreads) if (rows * num_heads >= 512) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const T* c = cos_sin + pos[i] * rot_dim;
    const T* s = c + half;
    for (int64_t h = 0; h < num_heads; ++h) {
      T* v = x + i * row_stride + h * head_size;
      if (neox) {
#pragma omp simd
        for (int64_t j = 0; j < half; ++j) {
          const float x1 = to_f(v[j]), x2 = to_f(v[j + half]);
          const float cj = to_f(c[j]), sj = to_f(s[j]);
          v[j] = from_f<T>(round_to<T>(x1 * cj) - round_to<T>(x2 * sj));
          v[j + half] = from_f<T>(round_to<T>(x2 * cj) + round_to<T>(x1 * sj));
        }
      } else {
        for (int64_t j = 0; j < half; ++j) {
          const float x1 = to_f(v[2 * j]), x2 = to_f(v[2 * j + 1]);
          const float cj = to_f(c[j]), sj = to_f(s[j]);
          v[2 * j] = from_f<T>(round_to<T>(x1 * cj) - round_to<T>(x2 * sj));
          v[2 * j + 1] = from_f<T>(round_to<T>(x2 * cj) + round_to<T>(x1 * sj));
        }
      }
    }
  }
}

// ------------------------------------------------------------------ SwiGLU
// out[i, j] = T(T(silu(g)) * u) with g = x[i, j], u = x[i, d + j].
#if VLLM_HAVE_BF16_GEMM
// silu_and_mul for bf16: the same roundings, 16 features per instruction; the sigmoid
// takes one division, 1 / (1 + e) and e times that (exact against torch in bf16).
void silu_and_mul_bf16(const bf16* x, int64_t x_stride, bf16* out, int64_t out_stride,
                       int64_t rows, int64_t d, int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (rows * d >= 32768) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const bf16* g = x + i * x_stride;
    const bf16* u = g + d;
    bf16* o = out + i * out_stride;
    for (int64_t j = 0; j < d; j += 16) {
      const __mmask16 m = tail_mask(d - j);
      const __m512 gv = bf16x16_to_f(g + j, m);
      const __m512 e = exp16_nonpos(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(gv)));
      const __m512 r =
          _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
      const __mmask16 neg = _mm512_cmp_ps_mask(gv, _mm512_setzero_ps(), _CMP_LT_OQ);
      const __m512 sig = _mm512_mask_mul_ps(r, neg, e, r);
      const __m512 prod =
          _mm512_mul_ps(round_bf16(_mm512_mul_ps(gv, sig)), bf16x16_to_f(u + j, m));
      _mm256_mask_storeu_epi16(o + j, m, f_to_bf16x16(prod));
    }
  }
}
#endif

template <typename T>
void silu_and_mul(const T* x, int64_t x_stride, T* out, int64_t out_stride, int64_t rows,
                  int64_t d, int nthreads) {
#if VLLM_HAVE_BF16_GEMM
  if constexpr (std::is_same_v<T, bf16>) {
    silu_and_mul_bf16(x, x_stride, out, out_stride, rows, d, nthreads);
    return;
  }
#endif
#pragma omp parallel for num_threads(nthreads) if (rows * d >= 32768) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const T* g = x + i * x_stride;
    const T* u = g + d;
    T* o = out + i * out_stride;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) {
      const float gv = to_f(g[j]);
      // silu(g) = g * sigmoid(g); sigmoid from exp(-|g|) so the exponent is never > 0.
      const float e = exp_nonpos(-std::fabs(gv));
      const float sig = gv >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
      o[j] = from_f<T>(round_to<T>(gv * sig) * to_f(u[j]));
    }
  }
}

// ------------------------------------------------------------------ KV cache write
// Cache layout per layer: [2][kv_heads][num_slots][head_size] (K then V).
// k, v: [tokens, kv_heads * head_size] rows `row_stride` elements apart.
void write_kv(const char* k, const char* v, int64_t row_stride, char* k_cache, char* v_cache,
              int64_t num_slots, const int64_t* slots, int64_t tokens, int64_t kv_heads,
              int64_t head_size, int64_t elem, int nthreads) {
  const int64_t bytes = head_size * elem;
#pragma omp parallel for num_threads(nthreads) if (tokens >= 256) schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = slots[t];
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t src = (t * row_stride + h * head_size) * elem;
      const int64_t dst = (h * num_slots + slot) * bytes;
      std::memcpy(k_cache + dst, k + src, bytes);
      std::memcpy(v_cache + dst, v + src, bytes);
    }
  }
}

// ------------------------------------------------------------------ decode attention
// One query token per sequence against its whole context in the paged cache.
// Work item = (sequence, kv head): the `groups` query heads sharing that KV head read
// each K and V row once. Scores, softmax and the weighted V sum are float32.

// Starts loading `bytes` from p into the cache (the K/V rows a loop reaches soon).
inline void prefetch_bytes(const void* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64)
    __builtin_prefetch(static_cast<const char*>(p) + off);
}

// One line into L2. As inline asm: GCC's dead-code elimination deletes a loop whose
// body is only __builtin_prefetch calls (the loops below vanished from the -O3 build).
inline void prefetch_line_l2(const char* p) {
#if defined(__x86_64__)
  asm volatile("prefetcht1 %0" : : "m"(*p));
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

// Asks for the `len` K and V rows of one KV head's context (its blocks through the block
// table) to be brought into L2 (prefetcht1): all of a work item's keys and values at its
// start, so the memory system has the whole item in flight while the first rows are
// computed on; the loops' per-row L1 prefetches then hit L2. Block by block, a block's K
// rows then its V rows: on a 2-core Xeon (64 sequences x 30 layers, blocks shuffled)
// ~48 -> ~40 ms, where all of K before all of V, or K and V lines alternating, gained
// next to nothing.
template <typename C>
inline void prefetch_context_l2(const C* k_base, const C* v_base, const int32_t* table,
                                int64_t len, int64_t block_size, int64_t d) {
  for (int64_t b = 0; b * block_size < len; ++b) {
    const int64_t first = static_cast<int64_t>(table[b]) * block_size * d;
    const char* k = reinterpret_cast<const char*>(k_base + first);
    const char* v = reinterpret_cast<const char*>(v_base + first);
    const int64_t bytes = std::min<int64_t>(block_size, len - b * block_size) * d * sizeof(C);
    for (int64_t off = 0; off < bytes; off += 64) prefetch_line_l2(k + off);
    for (int64_t off = 0; off < bytes; off += 64) prefetch_line_l2(v + off);
  }
}

// The V row that the P.V loops read kAhead tokens from now.
constexpr int64_t kAhead = 8;
template <typename T>
inline void prefetch_v(const T* vbase, const int64_t* slots, int64_t t, int64_t len,
                       int64_t d) {
  if (t + kAhead < len) prefetch_bytes(vbase + slots[t + kAhead] * d, d * sizeof(T));
}

// slots[t] = cache slot of context position t, from the block table (no divisions in
// the token loops that follow).
inline void context_slots(const int32_t* table, int64_t len, int64_t block_size,
                          int64_t* slots) {
  for (int64_t b = 0, t = 0; t < len; ++b) {
    const int64_t base = static_cast<int64_t>(table[b]) * block_size;
    for (int64_t o = 0; o < block_size && t < len; ++o, ++t) slots[t] = base + o;
  }
}

// scores[g * len + t] = scale * q_g . k_t, portable version.
template <typename T, typename C>
void qk_scores(const T* q, int64_t groups, int64_t d, const C* kbase, const int64_t* slots,
               int64_t len, float scale, float* scores, float* qf,
               float* row) {
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t j = 0; j < d; ++j) qf[g * d + j] = to_f(q[g * d + j]) * scale;
  for (int64_t t = 0; t < len; ++t) {
    const C* kr = kbase + slots[t] * d;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) row[j] = to_f(kr[j]);
    for (int64_t g = 0; g < groups; ++g) {
      const float* qg = qf + g * d;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < d; ++j) s += qg[j] * row[j];
      scores[g * len + t] = s;
    }
  }
}

#if VLLM_HAVE_BF16_GEMM
// Horizontal sums of 16 vectors at once: lane i of the result = sum of the lanes of v[i].
// A shuffle tree (45 instructions for 16 sums) instead of 16 separate reductions.
inline __m512 sum16(const __m512* v) {
  __m512 w[4];
  for (int i = 0; i < 4; ++i) {
    const __m512 a = v[4 * i], b = v[4 * i + 1], c = v[4 * i + 2], d = v[4 * i + 3];
    // Per 128-bit chunk: [a0+a2, b0+b2, a1+a3, b1+b3], then the same for c, d.
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    // Per chunk: [sum a, sum b, sum c, sum d] over that chunk.
    w[i] = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, 0x44), _mm512_shuffle_ps(ab, cd, 0xEE));
  }
  // Chunk j of z01: w0's chunks 2j, 2j+1 summed (j < 2), then w1's; same for z23.
  const __m512 z01 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88),
                                   _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
  const __m512 z23 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x88),
                                   _mm512_shuffle_f32x4(w[2], w[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(z01, z23, 0x88),
                       _mm512_shuffle_f32x4(z01, z23, 0xDD));
}

// bf16 with AVX512-BF16: exact bf16 products summed in float32, 32 features per
// instruction, 16 tokens at a time (one sum16 per head per 16 tokens). Used when
// head_size is a multiple of 32 and at most 256, and groups at most 16. It also starts
// loading the V rows of the tokens it scores, for the P.V pass that follows: two
// streams in flight instead of one (64 sequences x 30 layers of SmolLM2-135M on a 2-core
// Xeon, cache blocks shuffled: 47 -> 39 ms).
void qk_scores_bf16(const bf16* q, int64_t groups, int64_t d, const bf16* kbase,
                    const bf16* vbase, const int64_t* slots, int64_t len, float scale,
                    float* scores) {
  const int64_t chunks = d / 32;
  __m512bh qv[16][8];
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t c = 0; c < chunks; ++c)
      qv[g][c] = (__m512bh)_mm512_loadu_si512(q + g * d + 32 * c);
  const __m512 vscale = _mm512_set1_ps(scale);
  const bf16* rows[16];
  __m512 acc[16];
  for (int64_t t0 = 0; t0 < len; t0 += 16) {
    const int64_t count = len - t0 < 16 ? len - t0 : 16;
    for (int64_t i = 0; i < 16; ++i)
      rows[i] = kbase + slots[t0 + (i < count ? i : 0)] * d;
    // The next 16 rows are scattered over the cache: start their loads now.
    for (int64_t i = 0; i < 16 && t0 + 16 + i < len; ++i)
      prefetch_bytes(kbase + slots[t0 + 16 + i] * d, d * 2);
    for (int64_t i = 0; i < count; ++i) prefetch_bytes(vbase + slots[t0 + i] * d, d * 2);
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t i = 0; i < 16; ++i) {
        __m512 a = _mm512_setzero_ps();
        for (int64_t c = 0; c < chunks; ++c)
          a = _mm512_dpbf16_ps(a, qv[g][c], (__m512bh)_mm512_loadu_si512(rows[i] + 32 * c));
        acc[i] = a;
      }
      const __mmask16 mask = count == 16 ? 0xffff : ((1u << count) - 1);
      _mm512_mask_storeu_ps(scores + g * len + t0, mask, _mm512_mul_ps(sum16(acc), vscale));
    }
  }
}
#endif

// Softmax of each of the `groups` rows of `len` scores, in place.
inline void softmax_rows(float* scores, int64_t groups, int64_t len) {
  for (int64_t g = 0; g < groups; ++g) {
    float* sg = scores + g * len;
    float mx = sg[0];
#pragma omp simd reduction(max : mx)
    for (int64_t t = 1; t < len; ++t) mx = sg[t] > mx ? sg[t] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < len; ++t) {
      sg[t] = exp_nonpos(sg[t] - mx);
      sum += sg[t];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t t = 0; t < len; ++t) sg[t] *= inv;
  }
}

// acc[g * d + j] = sum_t p[g * len + t] * v_t[j].
template <typename T>
void pv_sum(const float* p, int64_t groups, int64_t d, const T* vbase, const int64_t* slots,
            int64_t len, float* acc, float* row) {
  std::fill(acc, acc + groups * d, 0.0f);
  for (int64_t t = 0; t < len; ++t) {
    const T* vr = vbase + slots[t] * d;
    prefetch_v(vbase, slots, t, len, d);
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) row[j] = to_f(vr[j]);
    for (int64_t g = 0; g < groups; ++g) {
      const float pt = p[g * len + t];
      float* ag = acc + g * d;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) ag[j] += pt * row[j];
    }
  }
}

#if VLLM_HAVE_AVX512
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const bf16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
// 16 fp8 bytes -> 16 floats: one gather from the format's table.
template <typename F>
inline __m512 load16_fp8(const F* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_i32gather_ps(_mm512_cvtepu8_epi32(raw), fp8_table(p), 4);
}
inline __m512 load16(const fp8_e4m3* p) { return load16_fp8(p); }
inline __m512 load16(const fp8_e5m2* p) { return load16_fp8(p); }

// pv_sum for GB heads and head_size 16 * CH with the accumulators in registers:
// per token one conversion of the V row, then GB * CH fused multiply-adds.
template <typename T, int GB, int CH>
void pv_regs(const float* p, int64_t len, const T* vbase, const int64_t* slots, float* acc) {
  constexpr int64_t d = 16 * CH;
  __m512 a[GB][CH];
  for (int g = 0; g < GB; ++g)
    for (int c = 0; c < CH; ++c) a[g][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < len; ++t) {
    const T* vr = vbase + slots[t] * d;
    prefetch_v(vbase, slots, t, len, d);
    __m512 v[CH];
    for (int c = 0; c < CH; ++c) v[c] = load16(vr + 16 * c);
    for (int g = 0; g < GB; ++g) {
      const __m512 pg = _mm512_set1_ps(p[g * len + t]);
      for (int c = 0; c < CH; ++c) a[g][c] = _mm512_fmadd_ps(pg, v[c], a[g][c]);
    }
  }
  for (int g = 0; g < GB; ++g)
    for (int c = 0; c < CH; ++c) _mm512_storeu_ps(acc + g * d + 16 * c, a[g][c]);
}

// All `groups` heads, at most 24 accumulators per pass (the rest of the 32 registers
// hold the V row and the broadcast probability).
template <typename T, int CH>
void pv_regs_all(const float* p, int64_t groups, int64_t len, const T* vbase,
                 const int64_t* slots, float* acc) {
  constexpr int GB = 24 / CH;
  constexpr int64_t d = 16 * CH;
  int64_t g = 0;
  for (; g + GB <= groups; g += GB)
    pv_regs<T, GB, CH>(p + g * len, len, vbase, slots, acc + g * d);
  const float* pg = p + g * len;
  float* ag = acc + g * d;
  switch (groups - g) {
#define VLLM_PV_TAIL(R) \
    case R: pv_regs<T, (R < GB ? R : 1), CH>(pg, len, vbase, slots, ag); break;
    VLLM_PV_TAIL(1) VLLM_PV_TAIL(2) VLLM_PV_TAIL(3) VLLM_PV_TAIL(4) VLLM_PV_TAIL(5)
    VLLM_PV_TAIL(6) VLLM_PV_TAIL(7) VLLM_PV_TAIL(8) VLLM_PV_TAIL(9) VLLM_PV_TAIL(10)
    VLLM_PV_TAIL(11)
#undef VLLM_PV_TAIL
    default: break;
  }
}
#endif

// acc = P V for every head of the group, the register version where it applies.
template <typename T>
void pv_dispatch(const float* p, int64_t groups, int64_t d, const T* vbase,
                 const int64_t* slots, int64_t len, float* acc, float* row) {
#if VLLM_HAVE_AVX512
  switch (d) {
    case 32: pv_regs_all<T, 2>(p, groups, len, vbase, slots, acc); return;
    case 64: pv_regs_all<T, 4>(p, groups, len, vbase, slots, acc); return;
    case 128: pv_regs_all<T, 8>(p, groups, len, vbase, slots, acc); return;
    default: break;
  }
#endif
  pv_sum<T>(p, groups, d, vbase, slots, len, acc, row);
}

// q and out in the model dtype T; the caches in C (T itself, or fp8 with their
// dequantization scales folded in by the caller: K's into `scale`, V's `v_scale`
// multiplies the output).
template <typename T, typename C>
void decode_attention(const T* q, int64_t q_stride, const C* k_cache, const C* v_cache,
                      int64_t num_slots, const int32_t* block_table, int64_t bt_stride,
                      const int32_t* seq_lens, int64_t n, int64_t hq, int64_t hkv, int64_t d,
                      int64_t block_size, float scale, float v_scale, T* out,
                      int64_t out_stride, int nthreads) {
  const int64_t groups = hq / hkv;
#pragma omp parallel num_threads(nthreads) if (n * hkv > 1)
  {
    std::vector<float> qf(groups * d), acc(groups * d), row(d), scores;
    std::vector<int64_t> slots;
#pragma omp for schedule(guided) collapse(2)
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t kh = 0; kh < hkv; ++kh) {
        const int64_t len = seq_lens[i];
        slots.resize(len);
        context_slots(block_table + i * bt_stride, len, block_size, slots.data());
        prefetch_context_l2(k_cache + kh * num_slots * d, v_cache + kh * num_slots * d,
                            block_table + i * bt_stride, len, block_size, d);
        const T* qh = q + i * q_stride + kh * groups * d;
        scores.resize(groups * len);
        bool done = false;
#if VLLM_HAVE_BF16_GEMM
        if constexpr (std::is_same_v<T, bf16> && std::is_same_v<C, bf16>) {
          if (d % 32 == 0 && d <= 256 && groups <= 16) {
            qk_scores_bf16(qh, groups, d, k_cache + kh * num_slots * d,
                           v_cache + kh * num_slots * d, slots.data(), len,
                           scale, scores.data());
            done = true;
          }
        }
#endif
        if (!done)
          qk_scores<T, C>(qh, groups, d, k_cache + kh * num_slots * d, slots.data(), len,
                          scale, scores.data(), qf.data(), row.data());
        softmax_rows(scores.data(), groups, len);
        pv_dispatch<C>(scores.data(), groups, d, v_cache + kh * num_slots * d, slots.data(),
                       len, acc.data(), row.data());
        for (int64_t g = 0; g < groups; ++g) {
          T* o = out + i * out_stride + (kh * groups + g) * d;
          if constexpr (std::is_same_v<T, C>) {
            for (int64_t j = 0; j < d; ++j) o[j] = from_f<T>(acc[g * d + j]);
          } else {
            for (int64_t j = 0; j < d; ++j) o[j] = from_f<T>(acc[g * d + j] * v_scale);
          }
        }
      }
    }
  }
}

// ------------------------------------------------------------------ greedy sampling
// Row-wise argmax of the logits: the first index among equal maxima (as torch.argmax)
// and the first NaN where a row has one (torch's max reduction propagates NaN). torch's
// own bf16 reduction over a 49152-token vocabulary took ~1.5 ms for 64 rows on a 2-core
// Xeon, a few percent of a decode step; one pass of 16-lane compares is memory speed.
template <typename T>
int64_t argmax_row(const T* x, int64_t n) {
  int64_t j = 0, best = 0;
  float bv = -std::numeric_limits<float>::infinity();
#if VLLM_HAVE_AVX512
  if (n >= 16) {
    __m512 vbest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __m512i vidx = _mm512_setzero_si512();
    __m512i cur = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    for (; j + 16 <= n; j += 16) {
      const __m512 v = load16(x + j);
      if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) break;  // a NaN: the scalar loop finds it
      const __mmask16 gt = _mm512_cmp_ps_mask(v, vbest, _CMP_GT_OQ);  // strict: first wins
      vbest = _mm512_mask_mov_ps(vbest, gt, v);
      vidx = _mm512_mask_mov_epi32(vidx, gt, cur);
      cur = _mm512_add_epi32(cur, step);
    }
    bv = _mm512_reduce_max_ps(vbest);
    const __mmask16 at = _mm512_cmp_ps_mask(vbest, _mm512_set1_ps(bv), _CMP_EQ_OQ);
    best = _mm512_mask_reduce_min_epi32(at, vidx);
  }
#endif
  for (; j < n; ++j) {
    const float v = to_f(x[j]);
    if (v != v) return j;
    if (v > bv) {
      bv = v;
      best = j;
    }
  }
  return best;
}

template <typename T>
void argmax_rows(const T* x, int64_t stride, int64_t rows, int64_t n, int64_t* out,
                 int nthreads) {
#pragma omp parallel for num_threads(nthreads) if (rows * n >= 65536) schedule(static)
  for (int64_t i = 0; i < rows; ++i) out[i] = argmax_row(x + i * stride, n);
}

#if VLLM_HAVE_PACKED_GEMM
// ------------------------------------------------------------------ bf16 GEMM, packed W
// W [N, K] repacked once (pack_vnni) as [N/16 blocks][K/2][16 lanes][2]: each 64-byte
// vector holds one k-pair of 16 output features, the operand layout of VDPBF16PS. The
// kernel broadcasts a k-pair of an x row and accumulates 16 outputs per instruction:
// no horizontal sums, and each W vector serves up to 12 rows of x. Two 16-feature
// blocks and 12 rows per pass: 24 accumulators (of 32 registers). Each thread owns a
// contiguous range of blocks, so it streams its part of W from memory once; later groups
// of 12 rows find the tile in L1/L2. On 2 cores this matches oneDNN from 64 rows up
// (both near the bf16 peak) and beats it below (decode): 30 layers of SmolLM2-135M at
// 1 / 16 rows took ~9 / ~14-16 ms against oneDNN's ~15 / ~20 ms.
//
// Without AVX512-BF16 (AVX2 + FMA) the same layout serves a float32 kernel: a 32-byte
// load holds one k-pair of 8 features, each 32-bit word [w(k) | w(k+1)] bf16; shifting
// the word left by 16 bits is w(k) as a float, clearing its low half w(k+1) (a bf16 is
// the top half of a float). So every product is exact in float32, summed with FMA, and
// a decode step reads 2 bytes a weight: half of what the float32 copy of gemm_autotune
// reads, and batch-1 decode is memory-bound.

constexpr int64_t kLanes = 16;

inline int64_t padded_n(int64_t N) { return (N + 2 * kLanes - 1) / (2 * kLanes) * (2 * kLanes); }

void pack_vnni(const bf16* w, int64_t N, int64_t K, bf16* out, int nthreads) {
  const int64_t blocks = padded_n(N) / kLanes, pairs = K / 2;
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    bf16* dst = out + b * pairs * kLanes * 2;
    for (int64_t kp = 0; kp < pairs; ++kp)
      for (int64_t lane = 0; lane < kLanes; ++lane) {
        const int64_t n = b * kLanes + lane;
        for (int64_t e = 0; e < 2; ++e)
          dst[(kp * kLanes + lane) * 2 + e] = n < N ? w[n * K + 2 * kp + e] : bf16(0);
      }
  }
}

// How far ahead (in k pairs, one 64-byte line of a feature block each) gemm_tile asks
// for the weights: 4 KiB per stream. The hardware prefetcher alone keeps a single-row
// product near the memory bandwidth, but from two rows up the multiply-adds slow the
// loads enough that its requests come late: measured on SmolLM2's projections (2 cores,
// AVX512-BF16, weights streamed from memory), 16 rows took 9.9 ms without, 8.1 ms with
// (64 pairs ahead; 16: 10.3, 32: 9.3, 128: 9.1), 3 rows 7.9 -> 6.3 ms, 1 row the same.
// A request past the packed block only brings a line of the next one (prefetches never
// fault). One-row tiles do without: they gain nothing from memory (measured in both of
// this VM's bandwidth phases), and on a weight already in cache (as the start-up timing
// sees it, gemm_autotune.py) the extra instruction per load made one row slow enough to
// lose to another kernel.
// The AVX2 kernel prefetches from one row up: widening each weight pair to two float
// vectors slows even a one-row loop enough for the hardware's requests to come late
// (the AVX2 build run on an AVX512-BF16 EPYC, same probe, with the next-tile prefetch
// of gemm_blocks: 1 row 8.7 -> 6.7 ms, 4 rows 10.4 -> 6.4 ms, 16 rows 26.4 -> 21.8 ms).
constexpr int64_t kPrefetchPairs = 64;
#if VLLM_HAVE_BF16_GEMM
constexpr int kPrefetchRows = 2;
#else
constexpr int kPrefetchRows = 1;
#endif

// Weights of the tile itself, kPrefetchPairs pairs ahead of pair kp, into L1.
template <int NB>
inline void prefetch_own(const bf16* p, int64_t block, int64_t kp) {
  for (int j = 0; j < NB; ++j)
    _mm_prefetch(
        reinterpret_cast<const char*>(p + j * block + (kp + kPrefetchPairs) * 2 * kLanes),
        _MM_HINT_T0);
}

// One line per block of the next tile every `every` pairs, into L2 (see gemm_blocks).
template <int NB>
inline void prefetch_ahead(const bf16*& ahead, int64_t& countdown, int64_t every,
                           int64_t block) {
  if (ahead == nullptr || --countdown != 0) return;
  countdown = every;
  for (int j = 0; j < NB; ++j)
    _mm_prefetch(reinterpret_cast<const char*>(ahead + j * block), _MM_HINT_T1);
  ahead += 2 * kLanes;
}

#if VLLM_HAVE_BF16_GEMM
using Vec = __m512;

inline __m512 load_bias16(const bf16* bias, int64_t n0, int64_t N) {
  if (bias == nullptr) return _mm512_setzero_ps();
  const int64_t left = N - n0;
  const __mmask16 mask = left >= 16 ? 0xffff : (left <= 0 ? 0 : ((1u << left) - 1));
  const __m256i raw = _mm256_maskz_loadu_epi16(mask, bias + n0);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline void store16(bf16* y, int64_t n0, int64_t N, __m512 v) {
  const int64_t left = N - n0;
  if (left <= 0) return;
  const __mmask16 mask = left >= 16 ? 0xffff : ((1u << left) - 1);
  _mm256_mask_storeu_epi16(y + n0, mask, (__m256i)_mm512_cvtneps_pbh(v));
}

// `ahead` (may be null): where this group asks for the next tile's weights, one k-pair
// line per block every `every` pairs of its own loop, into L2 (see gemm_blocks).
template <int MB, int NB>
void gemm_tile(const bf16* x, int64_t x_stride, const bf16* p, int64_t block, int64_t pairs,
               const __m512* bias, bf16* y, int64_t y_stride, int64_t n0, int64_t N,
               const bf16* ahead, int64_t every) {
  __m512 acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j) acc[m][j] = bias[j];
  int64_t countdown = every;
  for (int64_t kp = 0; kp < pairs; ++kp) {
    if constexpr (MB >= kPrefetchRows) {
      prefetch_own<NB>(p, block, kp);
      prefetch_ahead<NB>(ahead, countdown, every, block);
    }
    __m512bh w[NB];
    for (int j = 0; j < NB; ++j)
      w[j] = (__m512bh)_mm512_loadu_si512(p + j * block + kp * 2 * kLanes);
    for (int m = 0; m < MB; ++m) {
      int32_t pair;
      std::memcpy(&pair, x + m * x_stride + 2 * kp, 4);
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xb, w[j]);
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j) store16(y + m * y_stride, n0 + j * kLanes, N, acc[m][j]);
}

#else   // AVX2 + FMA
using Vec = __m256;

inline __m256 load_bias8(const bf16* bias, int64_t n0, int64_t N) {
  alignas(32) float tmp[8];
  for (int64_t i = 0; i < 8; ++i)
    tmp[i] = bias != nullptr && n0 + i < N ? to_f(bias[n0 + i]) : 0.0f;
  return _mm256_load_ps(tmp);
}

// Rounds 8 sums to bf16 (nearest even, as torch) and stores those below N.
inline void store8(bf16* y, int64_t n0, int64_t N, __m256 v) {
  alignas(32) float tmp[8];
  _mm256_store_ps(tmp, v);
  for (int64_t i = 0; i < 8 && n0 + i < N; ++i) y[n0 + i] = from_f<bf16>(tmp[i]);
}

// MB rows against NB blocks of 16 features (2 * NB vectors of 8): MB * 2 * NB
// accumulators, 2 * MB broadcast inputs and one weight vector pair in 16 registers.
template <int MB, int NB>
void gemm_tile(const bf16* x, int64_t x_stride, const bf16* p, int64_t block, int64_t pairs,
               const __m256* bias, bf16* y, int64_t y_stride, int64_t n0, int64_t N,
               const bf16* ahead, int64_t every) {
  constexpr int V = 2 * NB;
  const __m256i high = _mm256_set1_epi32(static_cast<int32_t>(0xffff0000u));
  __m256 acc[MB][V];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < V; ++j) acc[m][j] = bias[j];
  int64_t countdown = every;
  for (int64_t kp = 0; kp < pairs; ++kp) {
    if constexpr (MB >= kPrefetchRows) {
      prefetch_own<NB>(p, block, kp);
      prefetch_ahead<NB>(ahead, countdown, every, block);
    }
    __m256 xe[MB], xo[MB];
    for (int m = 0; m < MB; ++m) {
      int32_t pair;
      std::memcpy(&pair, x + m * x_stride + 2 * kp, 4);
      const __m256i b = _mm256_set1_epi32(pair);
      xe[m] = _mm256_castsi256_ps(_mm256_slli_epi32(b, 16));
      xo[m] = _mm256_castsi256_ps(_mm256_and_si256(b, high));
    }
    for (int j = 0; j < V; ++j) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
          p + (j / 2) * block + kp * 2 * kLanes + (j % 2) * kLanes));
      const __m256 we = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
      const __m256 wo = _mm256_castsi256_ps(_mm256_and_si256(w, high));
      for (int m = 0; m < MB; ++m) {
        acc[m][j] = _mm256_fmadd_ps(xe[m], we, acc[m][j]);
        acc[m][j] = _mm256_fmadd_ps(xo[m], wo, acc[m][j]);
      }
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < V; ++j) store8(y + m * y_stride, n0 + j * 8, N, acc[m][j]);
}

#endif  // VLLM_HAVE_BF16_GEMM

// Rows [0, M) of x against NB blocks of W starting at `p` (features n0 ...), in the
// fewest groups of at most MB rows, of sizes as equal as they can be (16 rows: 8 + 8,
// not 12 + 4). The first group streams the weight block from memory, the others read it
// again from cache; a small last group has too few independent accumulators to keep the
// multiply-add units busy, so balanced groups finish sooner (measured: 16 decode rows of
// SmolLM2's projections, AVX512-BF16). Each row's sums are the same whatever the groups.
template <int MB, int NB>
void gemm_group(int64_t rows, const bf16* x, int64_t x_stride, const bf16* p, int64_t block,
                int64_t pairs, const Vec* bias, bf16* y, int64_t y_stride, int64_t n0,
                int64_t N, const bf16* ahead, int64_t every) {
  switch (rows) {
#define VLLM_ROWS(R)                                                                  \
    case R:                                                                             \
      gemm_tile<(R <= MB ? R : 1), NB>(x, x_stride, p, block, pairs, bias, y, y_stride, \
                                       n0, N, ahead, every);                            \
      break;
    VLLM_ROWS(1) VLLM_ROWS(2) VLLM_ROWS(3) VLLM_ROWS(4) VLLM_ROWS(5) VLLM_ROWS(6)
    VLLM_ROWS(7) VLLM_ROWS(8) VLLM_ROWS(9) VLLM_ROWS(10) VLLM_ROWS(11) VLLM_ROWS(12)
#undef VLLM_ROWS
    default: break;
  }
}

// Only the first group streams the block from memory; with two groups or more the others
// compute from cache while the memory system idles. So every group (of kPrefetchRows
// rows or more) also asks for its share of the next tile's weights (`next`, null for a
// thread's last tile): group g for pairs from g * pairs / groups on, one line per block
// every `groups` pairs of its loop. The next tile is in L2 when its first group starts,
// and memory time overlaps compute time instead of adding to it. SmolLM2's projections
// and LM head from memory (2 cores, AVX512-BF16), ms for one decode step's worth: 8 rows
// 7.18 -> 6.49, 16 rows 8.03 -> 7.09, 24 rows 9.94 -> 7.60, 64 rows 21.2 -> 18.4; 1 row
// (no prefetch in tiles that narrow) 6.7 either way.
template <int MB, int NB>
void gemm_blocks(const bf16* x, int64_t x_stride, int64_t M, const bf16* p, int64_t block,
                 int64_t pairs, const Vec* bias, bf16* y, int64_t y_stride, int64_t n0,
                 int64_t N, const bf16* next) {
  static_assert(MB <= 12, "gemm_group instantiates groups of up to 12 rows");
  const int64_t groups = (M + MB - 1) / MB;
  if (groups == 0) return;
  const int64_t base = M / groups, larger = M % groups;  // `larger` groups of base + 1
  int64_t m = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t rows = base + (g < larger ? 1 : 0);
    const bf16* ahead =
        next != nullptr ? next + g * pairs / groups * 2 * kLanes : nullptr;
    gemm_group<MB, NB>(rows, x + m * x_stride, x_stride, p, block, pairs, bias,
                       y + m * y_stride, y_stride, n0, N, ahead, groups);
    m += rows;
  }
}

void gemm_packed(const bf16* x, int64_t x_stride, int64_t M, const bf16* packed, int64_t N,
                 int64_t K, const bf16* bias, bf16* y, int64_t y_stride, int nthreads) {
  const int64_t pairs = K / 2, block = pairs * kLanes * 2, tiles = padded_n(N) / (2 * kLanes);
#pragma omp parallel num_threads(nthreads)
  {
    const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t per = (tiles + nt - 1) / nt;
    const int64_t t0 = id * per, t1 = t0 + per < tiles ? t0 + per : tiles;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * 2 * kLanes;
      const bf16* p = packed + 2 * t * block;
      const bf16* next = t + 1 < t1 ? p + 2 * block : nullptr;
#if VLLM_HAVE_BF16_GEMM
      const __m512 b[2] = {load_bias16(bias, n0, N), load_bias16(bias, n0 + kLanes, N)};
      gemm_blocks<12, 2>(x, x_stride, M, p, block, pairs, b, y, y_stride, n0, N, next);
#else
      __m256 b[4];
      for (int j = 0; j < 4; ++j) b[j] = load_bias8(bias, n0 + j * 8, N);
      gemm_blocks<2, 2>(x, x_stride, M, p, block, pairs, b, y, y_stride, n0, N, next);
#endif
    }
  }
}


#if VLLM_HAVE_AMX_GEMM
// ------------------------------------------------------------------ bf16 GEMM on AMX
// The packed layout is already AMX's right-hand operand: in a 16-feature block, the 16
// k-pairs of one 32-wide k step are 16 rows of 64 bytes ([pair][lane][2]), a 1 KiB tile
// of stride 64 bytes. `tdpbf16ps` multiplies a 16 x 32 bf16 tile of x (16 rows, read in
// place with the row stride) by one such tile into a 16 x 16 float32 tile: 8192
// multiply-adds per instruction, against 512 for a VDPBF16PS. At decode sizes the
// product is bound by streaming W (each weight tile is used by one tile of rows), and
// the dot-product kernel is not: from a handful of rows up it runs out of arithmetic
// first. Which one runs at which row count is measured (gemm_autotune.py).
//
// Tiles: tmm0-3 accumulate 2 m-tiles x 2 feature blocks, tmm4/5 hold x, tmm6/7 hold W.
// Rows past M are read from a zero-padded copy of the last partial m-tile, so a tile
// load never reads past x. K must be a multiple of 32 (whole k steps).

struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

inline void amx_configure() {
  AmxTileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

// Linux lends a process the tile state only after it asks (arch_prctl).
bool amx_permitted() {
  static const bool ok = [] {
    constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

// One pass: MT (1 or 2) m-tiles of 16 rows at `a` (row stride a_stride elements) by two
// feature blocks (p0, p1), all k steps; the float sums land in c[MT * 2][256].
template <int MT>
inline void amx_pass(const bf16* a, int64_t a_stride, const bf16* p0, const bf16* p1,
                     int64_t ksteps, float* c, const bf16* next = nullptr) {
  const int64_t sb = a_stride * 2;
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (MT == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t ks = 0; ks < ksteps; ++ks) {
    if (next != nullptr) {  // the next feature pair's tiles of this k step
      const char* n0 = reinterpret_cast<const char*>(next + ks * 512);
      const char* n1 = n0 + (p1 - p0) * 2;
      for (int l = 0; l < 16; ++l) {
        _mm_prefetch(n0 + l * 64, _MM_HINT_T0);
        _mm_prefetch(n1 + l * 64, _MM_HINT_T0);
      }
    }
    _tile_loadd(4, a + ks * 32, sb);
    _tile_loadd(6, p0 + ks * 512, 64);
    _tile_loadd(7, p1 + ks * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (MT == 2) {
      _tile_loadd(5, a + 16 * a_stride + ks * 32, sb);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  if constexpr (MT == 2) {
    _tile_stored(2, c + 512, 64);
    _tile_stored(3, c + 768, 64);
  }
}

// Adds the bias to `rows` rows of a 16 x 16 float tile and stores them as bf16.
inline void amx_store(const float* c, __m512 bias, bf16* y, int64_t y_stride, int64_t rows,
                      int64_t n0, int64_t N) {
  for (int64_t r = 0; r < rows; ++r)
    store16(y + r * y_stride, n0, N, _mm512_add_ps(_mm512_load_ps(c + r * 16), bias));
}

void gemm_amx(const bf16* x, int64_t x_stride, int64_t M, const bf16* packed, int64_t N,
              int64_t K, const bf16* bias, bf16* y, int64_t y_stride, int nthreads) {
  const int64_t pairs = K / 2, block = pairs * kLanes * 2, tiles = padded_n(N) / (2 * kLanes);
  const int64_t ksteps = K / 32, full = M / 16, rest = M % 16;
  // The last partial m-tile, zero-padded to 16 rows.
  std::vector<bf16> tail(rest > 0 ? 16 * K : 0, bf16(0));
  for (int64_t r = 0; r < rest; ++r)
    std::memcpy(tail.data() + r * K, x + (full * 16 + r) * x_stride, K * 2);
#pragma omp parallel num_threads(nthreads)
  {
    const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t per = (tiles + nt - 1) / nt;
    const int64_t t0 = id * per, t1 = t0 + per < tiles ? t0 + per : tiles;
    alignas(64) float c[1024];
    if (t0 < t1) amx_configure();
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * 2 * kLanes;
      const bf16* p0 = packed + 2 * t * block;
      const bf16* p1 = p0 + block;
      const __m512 b0 = load_bias16(bias, n0, N), b1 = load_bias16(bias, n0 + kLanes, N);
      int64_t m = 0;
      // The first pass over this pair's W also fetches the next pair's: W streams from
      // memory while the tiles compute (the hardware prefetcher alone left decode-sized
      // products 15-20% slower).
      const bf16* next = t + 1 < t1 ? p0 + 2 * block : nullptr;
      for (; m + 2 <= full; m += 2) {
        amx_pass<2>(x + m * 16 * x_stride, x_stride, p0, p1, ksteps, c, m == 0 ? next : nullptr);
        bf16* ym = y + m * 16 * y_stride;
        amx_store(c, b0, ym, y_stride, 16, n0, N);
        amx_store(c + 256, b1, ym, y_stride, 16, n0 + kLanes, N);
        amx_store(c + 512, b0, ym + 16 * y_stride, y_stride, 16, n0, N);
        amx_store(c + 768, b1, ym + 16 * y_stride, y_stride, 16, n0 + kLanes, N);
      }
      for (; m <= full; ++m) {
        const bool partial = m == full;
        if (partial && rest == 0) break;
        amx_pass<1>(partial ? tail.data() : x + m * 16 * x_stride, partial ? K : x_stride,
                    p0, p1, ksteps, c, m == 0 ? next : nullptr);
        const int64_t rows = partial ? rest : 16;
        amx_store(c, b0, y + m * 16 * y_stride, y_stride, rows, n0, N);
        amx_store(c + 256, b1, y + m * 16 * y_stride, y_stride, rows, n0 + kLanes, N);
      }
    }
    if (t0 < t1) _tile_release();
  }
}
#endif  // VLLM_HAVE_AMX_GEMM

#endif  // VLLM_HAVE_PACKED_GEMM

// ------------------------------------------------------------------ fused decode layer
// One Llama-style decoder layer for a step of decodes only, bf16 activations: the same
// kernels the modules call, called from here instead of from Python, so a layer costs
// one foreign call instead of a dozen module calls, wrappers and allocations.
//
// Each projection is a `Linear`: a function with the C signature below and its
// context (int64 words). The bf16 packed GEMM (vllm_linear_bf16_packed, AVX512-BF16)
// is one; quant_ops.cpp's vllm_int4_linear_bf16 is another, reached through its
// address, so the fused layer runs exactly the product the module path runs for each
// weight format, and the other steps (norms, rotary, attention) need no AVX-512.
using LinearFn = void (*)(const int64_t* ctx, const bf16* x, int64_t x_stride, int64_t M,
                          bf16* y, int64_t y_stride, int nthreads);

struct Linear {
  LinearFn fn;
  const int64_t* ctx;
  void operator()(const bf16* x, int64_t x_stride, int64_t M, bf16* y, int64_t y_stride,
                  int nthreads) const {
    fn(ctx, x, x_stride, M, y, y_stride, nthreads);
  }
};

// ------------------------------------------------------------------ LoRA deltas
// y[m] += T(T(x[m] A_s^T) B_s^T) for the slot s of row m (-1: none), rounded where the
// module path (punica.py, active-dense) rounds: the shrink to bf16, the expand to bf16,
// then the sum. Float32 sums in another order than torch's mm, so a result may differ
// from the module path's in the last bit (tests compare tokens and logprobs to peft).
// ctx: {N, K, slots, then per slot: A [r, K] bf16, B [N, r] bf16, r}; A = 0: the slot
// does not adapt this projection. The scaling is folded into B (peft_loader.py).
constexpr int64_t kMaxLoraRank = 1024;

void lora_add(const int64_t* ctx, const int64_t* row_slots, const bf16* x, int64_t x_stride,
              int64_t M, bf16* y, int64_t y_stride, int nthreads) {
  const int64_t N = ctx[0], K = ctx[1], slots = ctx[2];
  // Shrinks of every adapted row first, then one parallel expand over the outputs (one
  // OpenMP region per projection, not per row: a region's barrier is what costs on a
  // busy machine).
  std::vector<float> t;
  std::vector<int64_t> rows;
  int64_t work = 0;
  for (int64_t m = 0; m < M; ++m) {
    const int64_t slot = row_slots[m];
    if (slot < 0 || slot >= slots || ctx[3 + 3 * slot] == 0) continue;
    const bf16* A = reinterpret_cast<const bf16*>(ctx[3 + 3 * slot]);
    const int64_t r = ctx[5 + 3 * slot];
    const bf16* xm = x + m * x_stride;
    rows.push_back(m);
    t.resize(rows.size() * kMaxLoraRank);
    float* tm = t.data() + (rows.size() - 1) * kMaxLoraRank;
    for (int64_t j = 0; j < r; ++j) {
      const bf16* a = A + j * K;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t k = 0; k < K; ++k) acc += to_f(xm[k]) * to_f(a[k]);
      tm[j] = round_to<bf16>(acc);
    }
    work += N * r;
  }
  const int64_t count = static_cast<int64_t>(rows.size());
#pragma omp parallel for num_threads(nthreads) if (work >= 65536) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t m = rows[i], slot = row_slots[m];
      const bf16* b = reinterpret_cast<const bf16*>(ctx[4 + 3 * slot]) + n * ctx[5 + 3 * slot];
      const int64_t r = ctx[5 + 3 * slot];
      const float* tm = t.data() + i * kMaxLoraRank;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t j = 0; j < r; ++j) acc += tm[j] * to_f(b[j]);
      bf16* ym = y + m * y_stride;
      ym[n] = from_f<bf16>(to_f(ym[n]) + round_to<bf16>(acc));
    }
  }
}

struct LayerWeights {
  const bf16 *in_norm, *post_norm;
  Linear qkv, o, gate_up, down;
};

// Per projection (qkv, o, gate_up, down) the LoRA context, or null.
struct LayerLoras {
  const int64_t *qkv, *o, *gate_up, *down;
};

struct LayerShape {
  int64_t hidden, heads, kv_heads, head_size, inter, rot_dim, neox;
  float eps, scale;
};

struct DecodeBatch {
  int64_t n;
  const int64_t* positions;
  const bf16* cos_sin;
  bf16 *k_cache, *v_cache;
  int64_t num_slots;
  const int64_t* slot_mapping;
  const int32_t* block_table;
  int64_t bt_stride;
  const int32_t* seq_lens;
  int64_t block_size;
  const int64_t* lora_slots;  // per row, -1: base model; null: no adapter in this step
};

// A projection and, when this step has adapters, its LoRA delta.
inline void project(const Linear& lin, const int64_t* lora, const DecodeBatch& b,
                    const bf16* x, int64_t x_stride, bf16* y, int64_t y_stride, int nthreads) {
  lin(x, x_stride, b.n, y, y_stride, nthreads);
  if (lora != nullptr && b.lora_slots != nullptr)
    lora_add(lora, b.lora_slots, x, x_stride, b.n, y, y_stride, nthreads);
}

// hidden [n, H]: in = this layer's input (previous MLP output or embedding), out = its
// MLP output. residual [n, H]: in = running residual (ignored when `first`), out = the
// residual after this layer. ws: n * (qkv + q + 2 * inter + inter + H) elements.
void llama_decode_layer(bf16* hidden, bf16* residual, int first, const LayerWeights& w,
                        const LayerLoras& l, const LayerShape& s, const DecodeBatch& b,
                        bf16* ws, int nthreads) {
  const int64_t n = b.n, H = s.hidden, d = s.head_size;
  const int64_t q_size = s.heads * d, kv_size = s.kv_heads * d;
  const int64_t qkv_n = q_size + 2 * kv_size;
  bf16* x = ws;                     // [n, H] normed input
  bf16* qkv = x + n * H;            // [n, qkv_n]
  bf16* attn = qkv + n * qkv_n;     // [n, q_size]
  bf16* gate_up = attn + n * q_size;  // [n, 2 * inter]
  bf16* act = gate_up + n * 2 * s.inter;  // [n, inter]
  if (first) {
    std::memcpy(residual, hidden, sizeof(bf16) * n * H);
    rms_norm<bf16>(hidden, H, nullptr, 0, w.in_norm, x, H, n, H, s.eps, nthreads);
  } else {
    rms_norm<bf16>(hidden, H, residual, H, w.in_norm, x, H, n, H, s.eps, nthreads);
  }
  project(w.qkv, l.qkv, b, x, H, qkv, qkv_n, nthreads);
  rotary<bf16>(qkv, n, qkv_n, s.heads + s.kv_heads, d, s.rot_dim, b.positions, b.cos_sin,
               static_cast<int>(s.neox), nthreads);
  write_kv(reinterpret_cast<const char*>(qkv + q_size),
           reinterpret_cast<const char*>(qkv + q_size + kv_size), qkv_n,
           reinterpret_cast<char*>(b.k_cache), reinterpret_cast<char*>(b.v_cache), b.num_slots,
           b.slot_mapping, n, s.kv_heads, d, sizeof(bf16), nthreads);
  decode_attention<bf16, bf16>(qkv, qkv_n, b.k_cache, b.v_cache, b.num_slots, b.block_table,
                               b.bt_stride, b.seq_lens, n, s.heads, s.kv_heads, d,
                               b.block_size, s.scale, 1.0f, attn, q_size, nthreads);
  project(w.o, l.o, b, attn, q_size, hidden, H, nthreads);
  rms_norm<bf16>(hidden, H, residual, H, w.post_norm, x, H, n, H, s.eps, nthreads);
  project(w.gate_up, l.gate_up, b, x, H, gate_up, 2 * s.inter, nthreads);
  silu_and_mul<bf16>(gate_up, 2 * s.inter, act, s.inter, n, s.inter, nthreads);
  project(w.down, l.down, b, act, s.inter, hidden, H, nthreads);
}


template <typename T>
void decode_attention_cache(int cache_dtype, const void* q, int64_t q_stride,
                            const void* k_cache, const void* v_cache, int64_t num_slots,
                            const int32_t* block_table, int64_t bt_stride,
                            const int32_t* seq_lens, int64_t n, int64_t hq, int64_t hkv,
                            int64_t d, int64_t block_size, float scale, float v_scale,
                            void* out, int64_t out_stride, int nthreads) {
  const T* qt = static_cast<const T*>(q);
  T* ot = static_cast<T*>(out);
#define VLLM_DECODE(C)                                                                   \
  decode_attention<T, C>(qt, q_stride, static_cast<const C*>(k_cache),                  \
                         static_cast<const C*>(v_cache), num_slots, block_table, bt_stride, \
                         seq_lens, n, hq, hkv, d, block_size, scale, v_scale, ot,         \
                         out_stride, nthreads)
  switch (cache_dtype) {
    case 2: VLLM_DECODE(fp8_e4m3); break;
    case 3: VLLM_DECODE(fp8_e5m2); break;
    default: VLLM_DECODE(T); break;
  }
#undef VLLM_DECODE
}

}  // namespace

extern "C" {

int vllm_cpu_ops_version() { return 1; }

int vllm_has_bf16_gemm() { return VLLM_HAVE_PACKED_GEMM; }

void vllm_rms_norm(int dtype, void* x, int64_t x_stride, void* residual, int64_t res_stride,
                   const void* w, void* out, int64_t out_stride, int64_t rows, int64_t d,
                   float eps, int nthreads) {
  if (dtype == 1)
    rms_norm<bf16>(static_cast<bf16*>(x), x_stride, static_cast<bf16*>(residual), res_stride,
                   static_cast<const bf16*>(w), static_cast<bf16*>(out), out_stride, rows, d,
                   eps, nthreads);
  else
    rms_norm<float>(static_cast<float*>(x), x_stride, static_cast<float*>(residual),
                    res_stride, static_cast<const float*>(w), static_cast<float*>(out),
                    out_stride, rows, d, eps, nthreads);
}

void vllm_rotary(int dtype, void* x, int64_t rows, int64_t row_stride, int64_t num_heads,
                 int64_t head_size, int64_t rot_dim, const int64_t* pos, const void* cos_sin,
                 int neox, int nthreads) {
  if (dtype == 1)
    rotary<bf16>(static_cast<bf16*>(x), rows, row_stride, num_heads, head_size, rot_dim, pos,
                 static_cast<const bf16*>(cos_sin), neox, nthreads);
  else
    rotary<float>(static_cast<float*>(x), rows, row_stride, num_heads, head_size, rot_dim,
                  pos, static_cast<const float*>(cos_sin), neox, nthreads);
}

void vllm_argmax(int dtype, const void* x, int64_t stride, int64_t rows, int64_t n,
                 int64_t* out, int nthreads) {
  if (dtype == 1)
    argmax_rows<bf16>(static_cast<const bf16*>(x), stride, rows, n, out, nthreads);
  else
    argmax_rows<float>(static_cast<const float*>(x), stride, rows, n, out, nthreads);
}

void vllm_silu_and_mul(int dtype, const void* x, int64_t x_stride, void* out,
                       int64_t out_stride, int64_t rows, int64_t d, int nthreads) {
  if (dtype == 1)
    silu_and_mul<bf16>(static_cast<const bf16*>(x), x_stride, static_cast<bf16*>(out),
                       out_stride, rows, d, nthreads);
  else
    silu_and_mul<float>(static_cast<const float*>(x), x_stride, static_cast<float*>(out),
                        out_stride, rows, d, nthreads);
}

// cache_dtype: 0/1 the model dtype (K/V rows copied as they are), 2/3 fp8 (the rows
// are already quantized, one byte per element).
void vllm_write_kv(int cache_dtype, const void* k, const void* v, int64_t row_stride,
                   void* k_cache, void* v_cache, int64_t num_slots, const int64_t* slots,
                   int64_t tokens, int64_t kv_heads, int64_t head_size, int nthreads) {
  const int64_t elem = cache_dtype == 0 ? 4 : (cache_dtype == 1 ? 2 : 1);
  write_kv(static_cast<const char*>(k), static_cast<const char*>(v), row_stride,
           static_cast<char*>(k_cache), static_cast<char*>(v_cache), num_slots, slots, tokens,
           kv_heads, head_size, elem, nthreads);
}

// dtype: of q and out (0/1); cache_dtype: of the caches (the same, or 2/3 fp8).
void vllm_decode_attention(int dtype, int cache_dtype, const void* q, int64_t q_stride,
                           const void* k_cache, const void* v_cache, int64_t num_slots,
                           const int32_t* block_table, int64_t bt_stride,
                           const int32_t* seq_lens, int64_t n, int64_t hq, int64_t hkv,
                           int64_t d, int64_t block_size, float scale, float v_scale,
                           void* out, int64_t out_stride, int nthreads) {
  if (dtype == 1)
    decode_attention_cache<bf16>(cache_dtype, q, q_stride, k_cache, v_cache, num_slots,
                                 block_table, bt_stride, seq_lens, n, hq, hkv, d, block_size,
                                 scale, v_scale, out, out_stride, nthreads);
  else
    decode_attention_cache<float>(cache_dtype, q, q_stride, k_cache, v_cache, num_slots,
                                  block_table, bt_stride, seq_lens, n, hq, hkv, d, block_size,
                                  scale, v_scale, out, out_stride, nthreads);
}

int64_t vllm_packed_numel(int64_t N, int64_t K) {
#if VLLM_HAVE_PACKED_GEMM
  return padded_n(N) * K;
#else
  (void)N; (void)K;
  return 0;
#endif
}

// W [N, K] (K even) -> the layout of vllm_gemm_bf16_packed; returns 0 without AVX512-BF16 or AVX2.
int vllm_pack_bf16(const void* w, int64_t N, int64_t K, void* out, int nthreads) {
#if VLLM_HAVE_PACKED_GEMM
  pack_vnni(static_cast<const bf16*>(w), N, K, static_cast<bf16*>(out), nthreads);
  return 1;
#else
  (void)w; (void)N; (void)K; (void)out; (void)nthreads;
  return 0;
#endif
}

int vllm_gemm_bf16_packed(const void* x, int64_t x_stride, int64_t M, const void* packed,
                          int64_t N, int64_t K, const void* bias, void* y, int64_t y_stride,
                          int nthreads) {
#if VLLM_HAVE_PACKED_GEMM
  gemm_packed(static_cast<const bf16*>(x), x_stride, M, static_cast<const bf16*>(packed), N, K,
              static_cast<const bf16*>(bias), static_cast<bf16*>(y), y_stride, nthreads);
  return 1;
#else
  (void)x; (void)x_stride; (void)M; (void)packed; (void)N; (void)K; (void)bias; (void)y;
  (void)y_stride; (void)nthreads;
  return 0;
#endif
}

// 1 when the AMX kernel is built and Linux lends this process the tile state.
int vllm_has_amx_gemm() {
#if VLLM_HAVE_AMX_GEMM
  return amx_permitted() ? 1 : 0;
#else
  return 0;
#endif
}

// vllm_gemm_bf16_packed on AMX tiles (K a multiple of 32); returns 0 where it cannot run.
int vllm_gemm_bf16_amx(const void* x, int64_t x_stride, int64_t M, const void* packed,
                       int64_t N, int64_t K, const void* bias, void* y, int64_t y_stride,
                       int nthreads) {
#if VLLM_HAVE_AMX_GEMM
  if (K % 32 != 0 || !amx_permitted()) return 0;
  gemm_amx(static_cast<const bf16*>(x), x_stride, M, static_cast<const bf16*>(packed), N, K,
           static_cast<const bf16*>(bias), static_cast<bf16*>(y), y_stride, nthreads);
  return 1;
#else
  (void)x; (void)x_stride; (void)M; (void)packed; (void)N; (void)K; (void)bias; (void)y;
  (void)y_stride; (void)nthreads;
  return 0;
#endif
}

// The bf16 packed GEMM as a fused-layer Linear: ctx = {packed W, N, K, bias (0: none),
// AMX row buckets (bit b: bucket b runs on AMX), the number B of bucket bounds, then the
// B inclusive upper row bounds}: the row-count plan of gemm_autotune.py, so the fused
// layer runs the kernel the module path would run for this many rows.
void vllm_linear_bf16_packed(const int64_t* ctx, const bf16* x, int64_t x_stride, int64_t M,
                             bf16* y, int64_t y_stride, int nthreads) {
#if VLLM_HAVE_PACKED_GEMM
  const bf16* w = reinterpret_cast<const bf16*>(ctx[0]);
  const bf16* bias = reinterpret_cast<const bf16*>(ctx[3]);
#if VLLM_HAVE_AMX_GEMM
  int64_t bucket = 0;
  while (bucket < ctx[5] && M > ctx[6 + bucket]) ++bucket;
  if (((ctx[4] >> bucket) & 1) && ctx[2] % 32 == 0 && amx_permitted()) {
    gemm_amx(x, x_stride, M, w, ctx[1], ctx[2], bias, y, y_stride, nthreads);
    return;
  }
#endif
  gemm_packed(x, x_stride, M, w, ctx[1], ctx[2], bias, y, y_stride, nthreads);
#else
  (void)ctx; (void)x; (void)x_stride; (void)M; (void)y; (void)y_stride; (void)nthreads;
#endif
}

int vllm_max_lora_rank() { return static_cast<int>(kMaxLoraRank); }

// Arrays of pointers / sizes keep the foreign signature short (see llama_fused.py for
// their order). wp: the two norm weights, then (function, context) of qkv, o, gate_up,
// down. lora: null, or the four projections' LoRA contexts (each may be null).
int vllm_llama_decode_layer(void* hidden, void* residual, int first, const void* const* wp,
                            const int64_t* shape, const float* fshape, const void* const* bp,
                            const int64_t* bshape, const void* const* lora, void* workspace,
                            int nthreads) {
  auto c = [](const void* p) { return static_cast<const bf16*>(p); };
  auto lin = [&](int i) {
    return Linear{reinterpret_cast<LinearFn>(const_cast<void*>(wp[i])),
                  static_cast<const int64_t*>(wp[i + 1])};
  };
  const LayerWeights w{c(wp[0]), c(wp[1]), lin(2), lin(4), lin(6), lin(8)};
  auto lc = [&](int i) {
    return lora == nullptr ? nullptr : static_cast<const int64_t*>(lora[i]);
  };
  const LayerLoras l{lc(0), lc(1), lc(2), lc(3)};
  const LayerShape s{shape[0], shape[1], shape[2], shape[3], shape[4], shape[5], shape[6],
                     fshape[0], fshape[1]};
  const DecodeBatch b{bshape[0], static_cast<const int64_t*>(bp[0]), c(bp[1]),
                      static_cast<bf16*>(const_cast<void*>(bp[2])),
                      static_cast<bf16*>(const_cast<void*>(bp[3])), bshape[1],
                      static_cast<const int64_t*>(bp[4]), static_cast<const int32_t*>(bp[5]),
                      bshape[2], static_cast<const int32_t*>(bp[6]), bshape[3],
                      static_cast<const int64_t*>(bp[7])};
  llama_decode_layer(static_cast<bf16*>(hidden), static_cast<bf16*>(residual), first, w, l, s,
                     b, static_cast<bf16*>(workspace), nthreads);
  return 1;
}

}  // extern "C"
