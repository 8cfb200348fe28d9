// CPU kernels for quantized linear layers, called through ctypes (see quant_ops.py).
//
// Decode (a few rows) is bound by reading the weights, so these kernels read the
// compact weights directly and widen a tile to float32 in registers: 4 bits a weight
// for int4 (a quarter of bf16's bytes), 8 bits for fp8. Accumulation is float32. On
// AVX2 the bf16 entry of int4 (vllm_int4_linear_bf16) multiplies in integers instead,
// on activations rounded to int8 runs (int4_linear_q8 below).
// Plain C ABI, built and cached by loader.py exactly like cpu_ops.cpp.
//
// int4 layout (int_weights.py): w [N, K/2] bytes; in each run of 32 inputs byte j holds
// input j (low nibble) and input j+16 (high nibble); scales, zeros [N, G] float32.
// out[m, n] = sum_g s[n,g] * (sum_{k in g} q[n,k] x[m,k] - z[n,g] * sum_{k in g} x[m,k]).
//
// fp8 layout: w [N, K] float8_e4m3fn bytes; x holds fp8 values already (as float32);
// out[m, n] = sum_k x[m,k] * w[n,k] (the caller applies the scales).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#define VLLM_QUANT_AVX512 1
#else
#define VLLM_QUANT_AVX512 0
#endif

// AVX2 CPUs (no AVX-512): 8-wide int4 rows; anything else takes the scalar loop.
#if !VLLM_QUANT_AVX512 && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VLLM_QUANT_AVX2 1
#else
#define VLLM_QUANT_AVX2 0
#endif

namespace {

float fp8_e4m3_to_float(uint8_t b) {
  const int e = (b >> 3) & 0xF, m = b & 7;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                           : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (b & 0x80) ? -mag : mag;
}

float bf16_to_float(uint16_t v) {
  const uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch converts float to bfloat16 (NaN stays a NaN).
uint16_t float_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Sums of x over each group: xs[m * G + g].
void group_sums(const float* x, int64_t M, int64_t K, int64_t G, float* xs) {
  const int64_t gs = K / G;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      float s = 0.f;
      for (int64_t k = g * gs; k < (g + 1) * gs; ++k) s += x[m * K + k];
      xs[m * G + g] = s;
    }
}

#if VLLM_QUANT_AVX512

// 16 bytes -> the 32 int4 values of one run as two float vectors (inputs 0-15, 16-31).
inline void load_run(const uint8_t* p, __m512& lo, __m512& hi) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F);
  lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, mask)));
  hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), mask)));
}

template <int M>
void int4_row(const float* x, int64_t K, const uint8_t* w, const float* s, const float* z,
              int64_t G, const float* xs, float bias, float* out, int64_t out_stride) {
  const int64_t gs = K / G;
  __m512 tot[M];
  float corr[M];
  for (int m = 0; m < M; ++m) { tot[m] = _mm512_setzero_ps(); corr[m] = 0.f; }
  for (int64_t g = 0; g < G; ++g) {
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t k = g * gs; k < (g + 1) * gs; k += 32) {
      __m512 lo, hi;
      load_run(w + k / 2, lo, hi);
      for (int m = 0; m < M; ++m) {
        acc[m] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x + m * K + k), acc[m]);
        acc[m] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + m * K + k + 16), acc[m]);
      }
    }
    const __m512 sv = _mm512_set1_ps(s[g]);
    for (int m = 0; m < M; ++m) {
      tot[m] = _mm512_fmadd_ps(acc[m], sv, tot[m]);
      corr[m] += s[g] * z[g] * xs[m * G + g];
    }
  }
  for (int m = 0; m < M; ++m) out[m * out_stride] = _mm512_reduce_add_ps(tot[m]) - corr[m] + bias;
}

// 16 fp8 e4m3 bytes -> 16 floats, exactly (normals by moving the bits into float32's
// fields, subnormals as m * 2^-9; denormal-free, so DAZ settings cannot change them).
inline __m512 fp8x16(const uint8_t* p) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i em = _mm512_and_si512(v, _mm512_set1_epi32(0x7F));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24);
  const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(em, 20), _mm512_set1_epi32(120 << 23));
  const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(em), _mm512_set1_ps(1.0f / 512.0f));
  const __mmask16 is_sub = _mm512_cmplt_epi32_mask(em, _mm512_set1_epi32(8));
  const __m512 mag = _mm512_mask_blend_ps(is_sub, _mm512_castsi512_ps(normal), sub);
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(mag), sign));
}

template <int M>
void fp8_row(const float* x, int64_t K, const uint8_t* w, float* out, int64_t out_stride) {
  __m512 acc[M];
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m512 wv = fp8x16(w + k);
    for (int m = 0; m < M; ++m)
      acc[m] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + m * K + k), acc[m]);
  }
  for (int m = 0; m < M; ++m) {
    float r = _mm512_reduce_add_ps(acc[m]);
    for (int64_t kk = k; kk < K; ++kk) r += fp8_e4m3_to_float(w[kk]) * x[m * K + kk];
    out[m * out_stride] = r;
  }
}

#endif  // VLLM_QUANT_AVX512

#if VLLM_QUANT_AVX2

inline float hmax8(__m256 v) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}

inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// 16 bytes -> the 32 int4 values of one run as four float vectors (inputs 0-7, 8-15,
// 16-23, 24-31).
inline void load_run8(const uint8_t* p, __m256* v) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(b, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
  v[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
  v[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
  v[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
  v[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

// The AVX-512 row's formula (per group: sum q x, times the scale; the zero point times
// the group's x sum subtracted once) on 8-wide vectors, two accumulators per row so
// the FMA chains overlap.
template <int M>
void int4_row(const float* x, int64_t K, const uint8_t* w, const float* s, const float* z,
              int64_t G, const float* xs, float bias, float* out, int64_t out_stride) {
  const int64_t gs = K / G;
  __m256 tot[M];
  float corr[M];
  for (int m = 0; m < M; ++m) { tot[m] = _mm256_setzero_ps(); corr[m] = 0.f; }
  for (int64_t g = 0; g < G; ++g) {
    __m256 a0[M], a1[M];
    for (int m = 0; m < M; ++m) a0[m] = a1[m] = _mm256_setzero_ps();
    for (int64_t k = g * gs; k < (g + 1) * gs; k += 32) {
      __m256 v[4];
      load_run8(w + k / 2, v);
      for (int m = 0; m < M; ++m) {
        const float* xm = x + m * K + k;
        a0[m] = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(xm), a0[m]);
        a1[m] = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(xm + 8), a1[m]);
        a0[m] = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(xm + 16), a0[m]);
        a1[m] = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xm + 24), a1[m]);
      }
    }
    const __m256 sv = _mm256_set1_ps(s[g]);
    for (int m = 0; m < M; ++m) {
      tot[m] = _mm256_fmadd_ps(_mm256_add_ps(a0[m], a1[m]), sv, tot[m]);
      corr[m] += s[g] * z[g] * xs[m * G + g];
    }
  }
  for (int m = 0; m < M; ++m) out[m * out_stride] = hsum8(tot[m]) - corr[m] + bias;
}


// bf16 activations on AVX2: each run of 32 inputs of a row is rounded to int8 with one
// float scale (max |x| / 127, nearest even), as llama.cpp's Q8 blocks. Then products
// q * x8 are exact integers: VPMADDUBSW multiplies unsigned nibbles by signed bytes and
// sums pairs in int16 (at most 2 * 15 * 127; the two halves of a run added: 4 * 15 * 127
// < 2^15, no saturation). That is about a third of the instructions of widening every
// nibble to float, which was compute-bound at ~0.3 cycles a weight, slower than
// streaming bf16 weights. The zero point multiplies the group's sum of the rounded
// activations, so the result is exactly sum_g s_g * sum_k (q_k - z_g) * x8_k * d_run.
// The rounding moves each input by at most 1/254 of its run's largest |x| (bf16 itself
// keeps 8 bits); heldout perplexity of int4 SmolLM2 through 8-token chunks (every
// product on this path) moved from 40.32 to 40.46.
//
// Two runs are read as one 32-byte load: the low nibbles are inputs 0-15 of both runs,
// the high nibbles inputs 16-31, so the int8 rows are stored in that order per pair of
// runs (x8 lo: run a 0-15 | run b 0-15; x8 hi: run a 16-31 | run b 16-31), and the int32
// sums come out as [run a x4 | run b x4], matched by a scale vector [d_a x4 | d_b x4].
struct Q8Rows {
  int64_t runs = 0, pairs = 0;
  std::vector<int8_t> q;    // [M, runs * 32] pair order above (an odd last run: as is)
  std::vector<float> d;     // [M, runs] run scales
  std::vector<float> gsum;  // [M, G]: sum over the group of d * x8
};

// One run of 32 bf16 inputs -> int8 (nearest even, VCVTPS2DQ's default rounding), the
// 16 first at lo, the 16 last at hi; returns the run's scale, adds the int8 sum.
inline float quantize_run(const uint16_t* x, int8_t* lo, int8_t* hi, int* sum) {
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int i = 0; i < 4; ++i) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 8 * i));
    v[i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
  }
  const float m = hmax8(amax);
  const __m256 inv = _mm256_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
  alignas(32) int32_t t[32];
  for (int i = 0; i < 4; ++i)
    _mm256_store_si256(reinterpret_cast<__m256i*>(t + 8 * i),
                       _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv)));
  for (int i = 0; i < 16; ++i) {
    lo[i] = static_cast<int8_t>(t[i]);
    hi[i] = static_cast<int8_t>(t[16 + i]);
    *sum += t[i] + t[16 + i];
  }
  return m / 127.0f;
}

void quantize_rows_q8(const uint16_t* x, int64_t x_stride, int64_t M, int64_t K, int64_t G,
                      Q8Rows& r) {
  const int64_t runs = K / 32, per_group = runs / G;
  r.runs = runs;
  r.pairs = runs / 2;
  r.q.resize(M * K);
  r.d.resize(M * runs);
  r.gsum.assign(M * G, 0.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < runs; ++b) {
      int8_t* base = r.q.data() + m * K + (b / 2) * 64;
      int8_t* lo = b < 2 * r.pairs ? base + (b % 2) * 16 : base;
      int8_t* hi = b < 2 * r.pairs ? lo + 32 : base + 16;
      int sum = 0;
      const float d = quantize_run(x + m * x_stride + b * 32, lo, hi, &sum);
      r.d[m * runs + b] = d;
      r.gsum[m * G + b / per_group] += d * static_cast<float>(sum);
    }
}

inline __m256 pair_vec(float a, float b) {
  return _mm256_set_m128(_mm_set1_ps(b), _mm_set1_ps(a));
}

// NR consecutive output features against M rows: M * NR independent FMA chains (one
// chain alone waits on the FMA latency at every pair).
template <int M, int NR>
void int4_rows_q8(const Q8Rows& xr, int64_t K, int64_t G, int64_t n, const uint8_t* w,
                  const float* scales, const float* zeros, const uint16_t* bias, uint16_t* y,
                  int64_t y_stride) {
  const int64_t runs = xr.runs, per_group = runs / G;
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[M][NR];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = _mm256_setzero_ps();
  for (int64_t p = 0; p < xr.pairs; ++p) {
    const int64_t ga = (2 * p) / per_group, gb = (2 * p + 1) / per_group;
    __m256i xlo[M], xhi[M];
    __m256 dv[M];
    for (int m = 0; m < M; ++m) {
      const int8_t* xq = xr.q.data() + m * K + p * 64;
      xlo[m] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
      xhi[m] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32));
      dv[m] = pair_vec(xr.d[m * runs + 2 * p], xr.d[m * runs + 2 * p + 1]);
    }
    for (int r = 0; r < NR; ++r) {
      const float* s = scales + (n + r) * G;
      const __m256 sv = ga == gb ? _mm256_set1_ps(s[ga]) : pair_vec(s[ga], s[gb]);
      const __m256i raw = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(w + (n + r) * (K / 2) + p * 32));
      const __m256i qlo = _mm256_and_si256(raw, mask);
      const __m256i qhi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
      for (int m = 0; m < M; ++m) {
        const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(qlo, xlo[m]),
                                             _mm256_maddubs_epi16(qhi, xhi[m]));
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones));
        acc[m][r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(dv[m], sv), acc[m][r]);
      }
    }
  }
  for (int r = 0; r < NR; ++r) {
    const float* s = scales + (n + r) * G;
    const float* z = zeros + (n + r) * G;
    const float b = bias ? bf16_to_float(bias[n + r]) : 0.f;
    for (int m = 0; m < M; ++m) {
      float total = hsum8(acc[m][r]) + b;
      if (runs % 2) {  // the odd last run, stored in input order
        const int64_t last = runs - 1;
        const __m128i raw = _mm_loadu_si128(
            reinterpret_cast<const __m128i*>(w + (n + r) * (K / 2) + last * 16));
        const __m128i m4 = _mm_set1_epi8(0x0F);
        const int8_t* xq = xr.q.data() + m * K + last * 32;
        const __m128i s16 = _mm_add_epi16(
            _mm_maddubs_epi16(_mm_and_si128(raw, m4),
                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(xq))),
            _mm_maddubs_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4),
                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(xq + 16))));
        const __m128i d32 = _mm_madd_epi16(s16, _mm_set1_epi16(1));
        alignas(16) int32_t t[4];
        _mm_store_si128(reinterpret_cast<__m128i*>(t), d32);
        total += static_cast<float>(t[0] + t[1] + t[2] + t[3]) * xr.d[m * runs + last] *
                 s[last / per_group];
      }
      for (int64_t g = 0; g < G; ++g) total -= s[g] * z[g] * xr.gsum[m * G + g];
      y[m * y_stride + n + r] = float_to_bf16(total);
    }
  }
}

// Output features in blocks of NR (the last ones one at a time), split across threads.
template <int M>
void int4_cols_q8(const Q8Rows& xr, int64_t N, int64_t K, int64_t G, const uint8_t* w,
                  const float* scales, const float* zeros, const uint16_t* bias, uint16_t* y,
                  int64_t y_stride, int nthreads) {
  constexpr int NR = M == 1 ? 4 : (M == 2 ? 2 : 1);
  const int64_t blocks = N / NR;
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int64_t i = 0; i < blocks; ++i)
    int4_rows_q8<M, NR>(xr, K, G, i * NR, w, scales, zeros, bias, y, y_stride);
  for (int64_t n = blocks * NR; n < N; ++n)
    int4_rows_q8<M, 1>(xr, K, G, n, w, scales, zeros, bias, y, y_stride);
}

void int4_linear_q8(const uint16_t* x, int64_t x_stride, int64_t M, const uint8_t* w,
                    int64_t N, int64_t K, const float* scales, const float* zeros, int64_t G,
                    const uint16_t* bias, uint16_t* y, int64_t y_stride, int nthreads) {
  Q8Rows xr;
  quantize_rows_q8(x, x_stride, M, K, G, xr);
  switch (M) {
#define VLLM_INT4_Q8_CASE(R) \
  case R: int4_cols_q8<R>(xr, N, K, G, w, scales, zeros, bias, y, y_stride, nthreads); break;
    VLLM_INT4_Q8_CASE(1) VLLM_INT4_Q8_CASE(2) VLLM_INT4_Q8_CASE(3) VLLM_INT4_Q8_CASE(4)
    VLLM_INT4_Q8_CASE(5) VLLM_INT4_Q8_CASE(6) VLLM_INT4_Q8_CASE(7) VLLM_INT4_Q8_CASE(8)
#undef VLLM_INT4_Q8_CASE
    default: break;
  }
}

#endif  // VLLM_QUANT_AVX2

void int4_row_scalar(const float* x, int64_t M, int64_t K, const uint8_t* w, const float* s,
                     const float* z, int64_t G, float bias, float* out, int64_t out_stride) {
  const int64_t gs = K / G;
  for (int64_t m = 0; m < M; ++m) {
    float r = bias;
    for (int64_t g = 0; g < G; ++g) {
      float acc = 0.f;
      for (int64_t k = g * gs; k < (g + 1) * gs; ++k) {
        const uint8_t byte = w[(k / 32) * 16 + (k % 16)];
        const int q = (k % 32) < 16 ? (byte & 0xF) : (byte >> 4);
        acc += (q - z[g]) * x[m * K + k];
      }
      r += acc * s[g];
    }
    out[m * out_stride] = r;
  }
}

}  // namespace

extern "C" {

int vllm_quant_ops_version() { return 1; }

int vllm_quant_has_avx512() { return VLLM_QUANT_AVX512; }

// Whether vllm_int4_linear_bf16 rounds its rows to int8 runs (int4_linear_q8).
int vllm_quant_int8_runs() { return VLLM_QUANT_AVX2; }

// x [M, K] float32 contiguous (M <= 8), K % 32 == 0, K % G == 0, (K / G) % 32 == 0.
void vllm_gemm_int4(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N,
                    const float* scales, const float* zeros, int64_t G, const float* bias,
                    float* out, int nthreads) {
  std::vector<float> xs(M * G);
  group_sums(x, M, K, G, xs.data());
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* wr = w + n * (K / 2);
    const float* s = scales + n * G;
    const float* z = zeros + n * G;
    const float b = bias ? bias[n] : 0.f;
#if VLLM_QUANT_AVX512 || VLLM_QUANT_AVX2
    switch (M) {
#define VLLM_INT4_CASE(R) \
  case R: int4_row<R>(x, K, wr, s, z, G, xs.data(), b, out + n, N); break;
      VLLM_INT4_CASE(1) VLLM_INT4_CASE(2) VLLM_INT4_CASE(3) VLLM_INT4_CASE(4)
      VLLM_INT4_CASE(5) VLLM_INT4_CASE(6) VLLM_INT4_CASE(7) VLLM_INT4_CASE(8)
#undef VLLM_INT4_CASE
      default: int4_row_scalar(x, M, K, wr, s, z, G, b, out + n, N);
    }
#else
    int4_row_scalar(x, M, K, wr, s, z, G, b, out + n, N);
#endif
  }
}

// The int4 linear of bf16 rows, as a layer calls it: y[m * y_stride + n] (bf16) = x rows
// (bf16, x_stride apart) @ W^T + bias. ctx holds the layer as int64 words: {w_q, N, K,
// scales, zeros, G, bias (bf16, 0: none)}. On AVX2 CPUs the rows are rounded to int8
// runs first (int4_linear_q8); elsewhere the arithmetic is vllm_gemm_int4's on float32
// copies of x and bias (exact). Results are rounded to bf16 to nearest even (torch's
// .to(bfloat16)). The module path (quant_ops.gemm_int4) and the fused decode layer
// (cpu_ops.cpp, through a function pointer) both call this, so they agree bit for bit.
// M <= 8; the same shape conditions as vllm_gemm_int4.
void vllm_int4_linear_bf16(const int64_t* ctx, const uint16_t* x, int64_t x_stride,
                           int64_t M, uint16_t* y, int64_t y_stride, int nthreads) {
  const auto* w = reinterpret_cast<const uint8_t*>(ctx[0]);
  const int64_t N = ctx[1], K = ctx[2], G = ctx[5];
  const auto* scales = reinterpret_cast<const float*>(ctx[3]);
  const auto* zeros = reinterpret_cast<const float*>(ctx[4]);
  const auto* bias = reinterpret_cast<const uint16_t*>(ctx[6]);
#if VLLM_QUANT_AVX2
  if (M >= 1 && M <= 8) {
    int4_linear_q8(x, x_stride, M, w, N, K, scales, zeros, G, bias, y, y_stride, nthreads);
    return;
  }
#endif
  std::vector<float> xf(M * K), out(M * N), bf(bias ? N : 0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xf[m * K + k] = bf16_to_float(x[m * x_stride + k]);
  for (int64_t n = 0; n < static_cast<int64_t>(bf.size()); ++n) bf[n] = bf16_to_float(bias[n]);
  vllm_gemm_int4(xf.data(), M, K, w, N, scales, zeros, G, bias ? bf.data() : nullptr,
                 out.data(), nthreads);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) y[m * y_stride + n] = float_to_bf16(out[m * N + n]);
}

// x [M, K] float32 holding fp8 values (M <= 8); w [N, K] fp8 bytes; out [M, N] unscaled.
void vllm_gemm_fp8(const float* x, int64_t M, int64_t K, const uint8_t* w, int64_t N,
                   float* out, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* wr = w + n * K;
#if VLLM_QUANT_AVX512
    switch (M) {
#define VLLM_FP8_CASE(R) \
  case R: fp8_row<R>(x, K, wr, out + n, N); break;
      VLLM_FP8_CASE(1) VLLM_FP8_CASE(2) VLLM_FP8_CASE(3) VLLM_FP8_CASE(4)
      VLLM_FP8_CASE(5) VLLM_FP8_CASE(6) VLLM_FP8_CASE(7) VLLM_FP8_CASE(8)
#undef VLLM_FP8_CASE
      default: break;
    }
    if (M >= 1 && M <= 8) continue;
#endif
    for (int64_t m = 0; m < M; ++m) {
      float r = 0.f;
      for (int64_t k = 0; k < K; ++k) r += fp8_e4m3_to_float(wr[k]) * x[m * K + k];
      out[m * N + n] = r;
    }
  }
}

}  // extern "C"
