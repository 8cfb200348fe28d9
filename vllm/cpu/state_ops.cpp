// Decode steps of the state-space layers, in place on the state cache (CPU).
//
// The torch path of one Mamba2 decode step gathers the batch's SSM states by slot,
// converts them to float32, decays them, adds dt * x (outer) B, reads them out through
// C, converts back and scatters them: about seven passes over a state of
// heads x head_dim x state_size per request and layer. Here each state row is read
// once and written once, where it lives: for every (request, head, p) row,
//   s[n] = s[n] * exp(dt * A) + dt * x[p] * B[n];   y[p] = sum_n s[n] * C[n] + D * x[p]
// with the arithmetic in float32 and the cache in float32 or bfloat16 (rounded to
// nearest even on the store, as torch's .to(torch.bfloat16)).
//
// The conv step likewise updates each request's [channels, K - 1] window in place and
// writes silu(window . weight + bias). The gated delta rule (Gated DeltaNet)
// needs S^T k before it can update S, so its state tile is decayed into a float32
// scratch on the first pass and updated, read out and stored on the second: one read and
// one write of the cache, the arithmetic and the single rounding as in the torch op.
//
// Plain C ABI (loaded with ctypes; no torch headers). Loops over the state dimension are
// written for the compiler's vectorizer (-O3 -march=native).

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

inline float bf16_to_f32(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// One state row of `n` values: decay, add, read out. Returns sum(s * c).
inline float row_f32(float* __restrict s, const float* __restrict b,
                     const float* __restrict c, int64_t n, float decay, float dtx) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) {
    float v = s[i] * decay + dtx * b[i];
    s[i] = v;
    acc += v * c[i];
  }
  return acc;
}

inline float row_bf16(uint16_t* __restrict s, const float* __restrict b,
                      const float* __restrict c, int64_t n, float decay, float dtx) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) {
    float v = bf16_to_f32(s[i]) * decay + dtx * b[i];
    uint16_t r = f32_to_bf16(v);
    s[i] = r;
    acc += v * c[i];
  }
  return acc;
}

inline float silu(float v) { return v / (1.f + std::exp(-v)); }

inline void store_row(int dtype, void* base, int64_t off, const float* v, int64_t n) {
  if (dtype == 0) {
    std::memcpy(static_cast<float*>(base) + off, v, n * sizeof(float));
  } else {
    uint16_t* d = static_cast<uint16_t*>(base) + off;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(v[i]);
  }
}

inline void load_row(int dtype, const void* base, int64_t off, float* v, int64_t n) {
  if (dtype == 0) {
    std::memcpy(v, static_cast<const float*>(base) + off, n * sizeof(float));
  } else {
    const uint16_t* d = static_cast<const uint16_t*>(base) + off;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) v[i] = bf16_to_f32(d[i]);
  }
}

}  // namespace

extern "C" {

int vllm_state_ops_version() { return 2; }

// Mamba2 (SSD) decode step for `batch` requests, their states at `slots` of `state`
// ([num_slots, heads, head_dim, state_size], row stride `slot_stride` elements;
// dtype 0 float32, 1 bfloat16). x [batch, heads, head_dim], dt [batch, heads]
// (softplus'ed), A [heads], B, C [batch, groups, state_size], D [heads] (or null):
// contiguous float32. y [batch, heads, head_dim] float32.
void vllm_ssd_decode(int dtype, void* state, int64_t slot_stride, const int64_t* slots,
                     int64_t batch, int64_t heads, int64_t head_dim, int64_t state_size,
                     int64_t groups, const float* x, const float* dt, const float* A,
                     const float* B, const float* C, const float* D, float* y,
                     int num_threads) {
  const int64_t heads_per_group = heads / groups;
#pragma omp parallel for collapse(2) schedule(static) num_threads(num_threads)
  for (int64_t r = 0; r < batch; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / heads_per_group;
      const float d = dt[r * heads + h];
      const float decay = std::exp(d * A[h]);
      const float dskip = D ? D[h] : 0.f;
      const float* b = B + (r * groups + g) * state_size;
      const float* c = C + (r * groups + g) * state_size;
      const float* xr = x + (r * heads + h) * head_dim;
      float* yr = y + (r * heads + h) * head_dim;
      const int64_t base = slots[r] * slot_stride + h * head_dim * state_size;
      for (int64_t p = 0; p < head_dim; ++p) {
        const int64_t off = base + p * state_size;
        const float acc =
            dtype == 0
                ? row_f32(static_cast<float*>(state) + off, b, c, state_size, decay, d * xr[p])
                : row_bf16(static_cast<uint16_t*>(state) + off, b, c, state_size, decay,
                           d * xr[p]);
        yr[p] = acc + dskip * xr[p];
      }
    }
  }
}

// Causal depthwise conv, one token per request: the window is the request's conv state
// ([channels, K - 1] at `slots`, row stride `slot_stride`; dtype 0 float32, 1 bfloat16)
// followed by x [batch, channels] (float32); out = silu(window . weight[c] + bias[c])
// (float32), and the state shifts by one (its oldest input drops, x enters).
void vllm_conv1d_decode(int dtype, void* state, int64_t slot_stride, const int64_t* slots,
                        int64_t batch, int64_t channels, int64_t width, const float* x,
                        const float* weight, const float* bias, float* out,
                        int num_threads) {
  const int64_t keep = width - 1;
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t base = slots[r] * slot_stride;
    for (int64_t c = 0; c < channels; ++c) {
      const float xin = x[r * channels + c];
      const float* w = weight + c * width;
      float acc = bias ? bias[c] : 0.f;
      if (dtype == 0) {
        float* s = static_cast<float*>(state) + base + c * keep;
        for (int64_t k = 0; k < keep; ++k) acc += s[k] * w[k];
        acc += xin * w[keep];
        for (int64_t k = 0; k + 1 < keep; ++k) s[k] = s[k + 1];
        if (keep > 0) s[keep - 1] = xin;
      } else {
        uint16_t* s = static_cast<uint16_t*>(state) + base + c * keep;
        for (int64_t k = 0; k < keep; ++k) acc += bf16_to_f32(s[k]) * w[k];
        acc += xin * w[keep];
        for (int64_t k = 0; k + 1 < keep; ++k) s[k] = s[k + 1];
        if (keep > 0) s[keep - 1] = f32_to_bf16(xin);
      }
      out[r * channels + c] = silu(acc);
    }
  }
}

// Gated delta rule, one token: q, k [batch, heads, dk], v [batch, heads, dv], g, beta
// [batch, heads] (g: log decay), float32; states [slots, heads, dk, dv] (dtype 0
// float32, 1 bfloat16): S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q.
// o [batch, heads, dv] float32.
void vllm_gated_delta_decode(int dtype, void* state, int64_t slot_stride,
                             const int64_t* slots, int64_t batch, int64_t heads, int64_t dk,
                             int64_t dv, const float* q, const float* k, const float* v,
                             const float* g, const float* beta, float* o, int num_threads) {
#pragma omp parallel num_threads(num_threads)
  {
    float* tile = new float[dk * dv];
    float* ks = new float[dv];
#pragma omp for collapse(2) schedule(static)
    for (int64_t r = 0; r < batch; ++r) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t rh = r * heads + h;
        const float decay = std::exp(g[rh]), bt = beta[rh];
        const float* kr = k + rh * dk;
        const float* qr = q + rh * dk;
        const float* vr = v + rh * dv;
        float* orow = o + rh * dv;
        const int64_t base = slots[r] * slot_stride + h * dk * dv;
        for (int64_t j = 0; j < dv; ++j) ks[j] = 0.f;
        for (int64_t i = 0; i < dk; ++i) {  // decay into the scratch; S^T k
          float* t = tile + i * dv;
          load_row(dtype, state, base + i * dv, t, dv);
          const float ki = kr[i];
#pragma omp simd
          for (int64_t j = 0; j < dv; ++j) {
            t[j] *= decay;
            ks[j] += ki * t[j];
          }
        }
        for (int64_t j = 0; j < dv; ++j) {  // delta, kept in ks
          ks[j] = (vr[j] - ks[j]) * bt;
          orow[j] = 0.f;
        }
        for (int64_t i = 0; i < dk; ++i) {  // update, read out, store
          float* t = tile + i * dv;
          const float ki = kr[i], qi = qr[i];
#pragma omp simd
          for (int64_t j = 0; j < dv; ++j) {
            t[j] += ki * ks[j];
            orow[j] += qi * t[j];
          }
          store_row(dtype, state, base + i * dv, t, dv);
        }
      }
    }
    delete[] ks;
    delete[] tile;
  }
}

}  // extern "C"
