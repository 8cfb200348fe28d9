// Vector math shared by the native kernel files. Each .cpp here is built as its own
// library (loader.py), so these are static inline definitions in a header; the loader
// hashes this folder's headers into every build's cache key.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

// exp(x) for x <= 0 on 16 lanes (softmax after max subtraction, silu's exp(-|g|)):
// 2^n * p(r), r in [-ln2/2, ln2/2], degree-6 Taylor polynomial (relative error below
// 2e-7), the scalar exp_nonpos's split; 2^n applied by vscalefps. Inputs below -87 are
// clamped there (the result stays a normal float).
static inline __m512 exp16_nonpos(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}
#endif
