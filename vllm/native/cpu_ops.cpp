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
// dtype codes: 0 = float32, 1 = bfloat16 (stored as uint16_t).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#include <omp.h>
#define VLLM_HAVE_BF16_GEMV 1
#else
#define VLLM_HAVE_BF16_GEMV 0
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

// ------------------------------------------------------------------ RMSNorm
// With a residual: residual <- x + residual (rounded to T), then the norm of that sum.
// out may alias x. out = T(w * T(h * rsqrt(mean(h^2) + eps))), the reference's order.
template <typename T>
void rms_norm(T* x, int64_t x_stride, T* residual, int64_t res_stride, const T* w, T* out,
              int64_t out_stride, int64_t rows, int64_t d, float eps, int nthreads) {
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
template <typename T>
void silu_and_mul(const T* x, int64_t x_stride, T* out, int64_t out_stride, int64_t rows,
                  int64_t d, int nthreads) {
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
              int64_t head_size, int64_t elem) {
  const int64_t bytes = head_size * elem;
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

inline int64_t slot_of(const int32_t* table, int64_t t, int64_t block_size) {
  return static_cast<int64_t>(table[t / block_size]) * block_size + t % block_size;
}

// scores[g * len + t] = scale * q_g . k_t, portable version.
template <typename T>
void qk_scores(const T* q, int64_t groups, int64_t d, const T* kbase, const int32_t* table,
               int64_t len, int64_t block_size, float scale, float* scores, float* qf,
               float* row) {
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t j = 0; j < d; ++j) qf[g * d + j] = to_f(q[g * d + j]) * scale;
  for (int64_t t = 0; t < len; ++t) {
    const T* kr = kbase + slot_of(table, t, block_size) * d;
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

#if VLLM_HAVE_BF16_GEMV
// bf16 with AVX512-BF16: exact bf16 products summed in float32, 32 features per step.
// Used when head_size is a multiple of 32 and at most 256, groups at most 16.
void qk_scores_bf16(const bf16* q, int64_t groups, int64_t d, const bf16* kbase,
                    const int32_t* table, int64_t len, int64_t block_size, float scale,
                    float* scores) {
  const int64_t chunks = d / 32;
  __m512bh qv[16][8];
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t c = 0; c < chunks; ++c)
      qv[g][c] = (__m512bh)_mm512_loadu_si512(q + g * d + 32 * c);
  for (int64_t t = 0; t < len; ++t) {
    const bf16* kr = kbase + slot_of(table, t, block_size) * d;
    __m512bh kv[8];
    for (int64_t c = 0; c < chunks; ++c) kv[c] = (__m512bh)_mm512_loadu_si512(kr + 32 * c);
    for (int64_t g = 0; g < groups; ++g) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t c = 0; c < chunks; ++c) acc = _mm512_dpbf16_ps(acc, qv[g][c], kv[c]);
      scores[g * len + t] = _mm512_reduce_add_ps(acc) * scale;
    }
  }
}
#endif

// Softmax of each of the `groups` rows of `len` scores, in place.
inline void softmax_rows(float* scores, int64_t groups, int64_t len) {
  for (int64_t g = 0; g < groups; ++g) {
    float* sg = scores + g * len;
    float mx = sg[0];
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
void pv_sum(const float* p, int64_t groups, int64_t d, const T* vbase, const int32_t* table,
            int64_t len, int64_t block_size, float* acc, float* row) {
  std::fill(acc, acc + groups * d, 0.0f);
  for (int64_t t = 0; t < len; ++t) {
    const T* vr = vbase + slot_of(table, t, block_size) * d;
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

template <typename T>
void decode_attention(const T* q, int64_t q_stride, const T* k_cache, const T* v_cache,
                      int64_t num_slots, const int32_t* block_table, int64_t bt_stride,
                      const int32_t* seq_lens, int64_t n, int64_t hq, int64_t hkv, int64_t d,
                      int64_t block_size, float scale, T* out, int64_t out_stride,
                      int nthreads) {
  const int64_t groups = hq / hkv;
#pragma omp parallel num_threads(nthreads) if (n * hkv > 1)
  {
    std::vector<float> qf(groups * d), acc(groups * d), row(d), scores;
#pragma omp for schedule(dynamic, 1) collapse(2)
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t kh = 0; kh < hkv; ++kh) {
        const int64_t len = seq_lens[i];
        const int32_t* table = block_table + i * bt_stride;
        const T* qh = q + i * q_stride + kh * groups * d;
        scores.resize(groups * len);
        bool done = false;
#if VLLM_HAVE_BF16_GEMV
        if constexpr (sizeof(T) == 2) {
          if (d % 32 == 0 && d <= 256 && groups <= 16) {
            qk_scores_bf16(qh, groups, d, k_cache + kh * num_slots * d, table, len,
                           block_size, scale, scores.data());
            done = true;
          }
        }
#endif
        if (!done)
          qk_scores<T>(qh, groups, d, k_cache + kh * num_slots * d, table, len, block_size,
                       scale, scores.data(), qf.data(), row.data());
        softmax_rows(scores.data(), groups, len);
        pv_sum<T>(scores.data(), groups, d, v_cache + kh * num_slots * d, table, len,
                  block_size, acc.data(), row.data());
        for (int64_t g = 0; g < groups; ++g) {
          T* o = out + i * out_stride + (kh * groups + g) * d;
          for (int64_t j = 0; j < d; ++j) o[j] = from_f<T>(acc[g * d + j]);
        }
      }
    }
  }
}

// ------------------------------------------------------------------ bf16 GEMV
// y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]) for a few rows m: the decode shape,
// where the product is bound by reading W once. AVX512-BF16 dot products of 32
// elements (exact bf16 products, float32 sums), MB rows of x against 4 rows of W.
#if VLLM_HAVE_BF16_GEMV
inline __m512bh load_bh(const bf16* p, int64_t k, int64_t K) {
  const int64_t left = K - k;
  if (left >= 32) return (__m512bh)_mm512_loadu_si512(p + k);
  const __mmask32 mask = (left <= 0) ? 0 : (0xffffffffu >> (32 - left));
  return (__m512bh)_mm512_maskz_loadu_epi16(mask, p + k);
}

// Dot products of MB rows of x with one row of W; results to y[m * y_stride].
template <int MB>
inline void dot_rows(const bf16* x, int64_t x_stride, const bf16* wr, int64_t K, float b,
                     bf16* y, int64_t y_stride) {
  // Two accumulators per x row break the dependency chain of the dot product.
  __m512 acc[MB][2];
  for (int m = 0; m < MB; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wr + k);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(wr + k + 32);
    for (int m = 0; m < MB; ++m) {
      const bf16* xm = x + m * x_stride + k;
      acc[m][0] = _mm512_dpbf16_ps(acc[m][0], (__m512bh)_mm512_loadu_si512(xm), w0);
      acc[m][1] = _mm512_dpbf16_ps(acc[m][1], (__m512bh)_mm512_loadu_si512(xm + 32), w1);
    }
  }
  for (; k < K; k += 32) {
    const __m512bh wv = load_bh(wr, k, K);
    for (int m = 0; m < MB; ++m)
      acc[m][0] = _mm512_dpbf16_ps(acc[m][0], load_bh(x + m * x_stride, k, K), wv);
  }
  for (int m = 0; m < MB; ++m)
    y[m * y_stride] = from_f<bf16>(_mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1])) + b);
}

// Rows [n0, n1) of W, read one after another: a single sequential stream per thread,
// which the hardware prefetcher follows best. Each row is used by all M rows of x
// (in blocks of 4) while it sits in L1, so W is read from memory once.
void gemv_rows(const bf16* x, int64_t x_stride, int64_t M, const bf16* w, int64_t n0,
               int64_t n1, int64_t K, const bf16* bias, bf16* y, int64_t y_stride) {
  for (int64_t n = n0; n < n1; ++n) {
    const bf16* wr = w + n * K;
    const float b = bias != nullptr ? to_f(bias[n]) : 0.0f;
    int64_t m = 0;
    for (; m + 4 <= M; m += 4)
      dot_rows<4>(x + m * x_stride, x_stride, wr, K, b, y + m * y_stride + n, y_stride);
    const bf16* xm = x + m * x_stride;
    bf16* ym = y + m * y_stride + n;
    switch (M - m) {
      case 3: dot_rows<3>(xm, x_stride, wr, K, b, ym, y_stride); break;
      case 2: dot_rows<2>(xm, x_stride, wr, K, b, ym, y_stride); break;
      case 1: dot_rows<1>(xm, x_stride, wr, K, b, ym, y_stride); break;
      default: break;
    }
  }
}

void gemv(const bf16* x, int64_t x_stride, int64_t M, const bf16* w, int64_t N, int64_t K,
          const bf16* bias, bf16* y, int64_t y_stride, int nthreads) {
  // One contiguous range of rows of W per thread.
#pragma omp parallel num_threads(nthreads)
  {
    const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t per = (N + nt - 1) / nt;
    const int64_t n0 = id * per, n1 = n0 + per < N ? n0 + per : N;
    if (n0 < n1) gemv_rows(x, x_stride, M, w, n0, n1, K, bias, y, y_stride);
  }
}
#endif

}  // namespace

extern "C" {

int vllm_cpu_ops_version() { return 1; }

int vllm_has_bf16_gemv() { return VLLM_HAVE_BF16_GEMV; }

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

void vllm_silu_and_mul(int dtype, const void* x, int64_t x_stride, void* out,
                       int64_t out_stride, int64_t rows, int64_t d, int nthreads) {
  if (dtype == 1)
    silu_and_mul<bf16>(static_cast<const bf16*>(x), x_stride, static_cast<bf16*>(out),
                       out_stride, rows, d, nthreads);
  else
    silu_and_mul<float>(static_cast<const float*>(x), x_stride, static_cast<float*>(out),
                        out_stride, rows, d, nthreads);
}

void vllm_write_kv(int dtype, const void* k, const void* v, int64_t row_stride, void* k_cache,
                   void* v_cache, int64_t num_slots, const int64_t* slots, int64_t tokens,
                   int64_t kv_heads, int64_t head_size) {
  write_kv(static_cast<const char*>(k), static_cast<const char*>(v), row_stride,
           static_cast<char*>(k_cache), static_cast<char*>(v_cache), num_slots, slots, tokens,
           kv_heads, head_size, dtype == 1 ? 2 : 4);
}

void vllm_decode_attention(int dtype, const void* q, int64_t q_stride, const void* k_cache,
                           const void* v_cache, int64_t num_slots, const int32_t* block_table,
                           int64_t bt_stride, const int32_t* seq_lens, int64_t n, int64_t hq,
                           int64_t hkv, int64_t d, int64_t block_size, float scale, void* out,
                           int64_t out_stride, int nthreads) {
  if (dtype == 1)
    decode_attention<bf16>(static_cast<const bf16*>(q), q_stride,
                           static_cast<const bf16*>(k_cache), static_cast<const bf16*>(v_cache),
                           num_slots, block_table, bt_stride, seq_lens, n, hq, hkv, d,
                           block_size, scale, static_cast<bf16*>(out), out_stride, nthreads);
  else
    decode_attention<float>(static_cast<const float*>(q), q_stride,
                            static_cast<const float*>(k_cache),
                            static_cast<const float*>(v_cache), num_slots, block_table,
                            bt_stride, seq_lens, n, hq, hkv, d, block_size, scale,
                            static_cast<float*>(out), out_stride, nthreads);
}

// Returns 0 when this build has no bf16 GEMV (the caller then falls back).
int vllm_gemv_bf16(const void* x, int64_t x_stride, int64_t M, const void* w, int64_t N,
                   int64_t K, const void* bias, void* y, int64_t y_stride, int nthreads) {
#if VLLM_HAVE_BF16_GEMV
  gemv(static_cast<const bf16*>(x), x_stride, M, static_cast<const bf16*>(w), N, K,
       static_cast<const bf16*>(bias), static_cast<bf16*>(y), y_stride, nthreads);
  return 1;
#else
  (void)x; (void)x_stride; (void)M; (void)w; (void)N; (void)K; (void)bias; (void)y;
  (void)y_stride; (void)nthreads;
  return 0;
#endif
}

}  // extern "C"
