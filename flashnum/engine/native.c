/* Fused kernels for the fp32 carrier (see flashnum/native.py): the exp site first.

   For a float32 x, p = fp32(exp(x)) (or exp2) rounded once to nearest even, and
   optionally pc = P cast of p to bf16 (round to nearest even), in one pass:

       x  = s[r, j] * c - m[r]      fp32 product (c = 1: none) and difference (the site s - m)
       y  = exp(x) in float64       |y - exp(x)| <= ~1.3 ulp of float64 (derivation below)
       p  = (float) y               one round-to-nearest-even into fp32
       pc = bf16(p)                 one round-to-nearest-even

   float64 evaluation, then one rounding: the same model as Arith.exp in
   flashnum/engine.py; bench/exp_exhaustive.py checks on every float32 input that
   the two give the same fp32 value, and that the value is the correctly rounded one.

   exp(x) = 2^(a/256) with a = x * 256/ln2 (exp2: a = x * 256, exact):
     256/ln2 = KHI + KLO, KHI with 29 significant bits, so x * KHI is exact (x has 24);
     k = nearest integer to x * KHI; h = (x * KHI - k) + x * KLO, |h| <= 0.5 + 2^-15
     (the subtraction is exact; the add rounds by <= 2^-54 absolute);
     2^(k/256) = 2^(k >> 8) * T[k & 255], T[j] = 2^(j/256) correctly rounded (rel. 2^-53);
     2^(h/256) = 1 + q(h), q = degree-4 Taylor polynomial of e^u - 1, u = h ln2/256,
     |u| < 0.00136, truncation < u^5/120 < 2^-54.5; y = (T + T*q) * 2^(k >> 8), the
     last product exact (a power of two, the result a normal double).
   Rounding errors: T 2^-53, the add 2^-53, T*q, Horner and h below 2^-60: |err| < 2.5 * 2^-53
   relative, ~1.3 ulp. Compiled with -ffp-contract=off so that every operation
   is the IEEE double operation written here, whatever the vector width. The
   constants are filled in by native.py from mpmath. */
#include <stdint.h>

#define KHI @KHI@
#define KLO @KLO@
#define SHIFT 0x1.8p52 /* adding and subtracting it rounds |a| < 2^51 to an integer */
#define BIAS 65536     /* > |k| = |a| <= 151 * 256 */
static const double T[256] = {@TABLE@};
static const double C1 = @C1@, C2 = @C2@, C3 = @C3@, C4 = @C4@;

/* bit casts (union punning is defined in C) */
typedef union { double d; int64_t i; } b64;
typedef union { float f; uint32_t i; } b32;
static inline int64_t bits64(double d) { b64 u = {.d = d}; return u.i; }
static inline double from64(int64_t i) { b64 u = {.i = i}; return u.d; }
static inline uint32_t bits32(float f) { b32 u = {.f = f}; return u.i; }
static inline float from32(uint32_t i) { b32 u = {.i = i}; return u.f; }

/* float64 exp (base2 = 0) or exp2 (base2 = 1) of a float32 value, rounded to fp32.
   Branch-free, so that the loops below vectorise. */
static inline float exp_round(float xf, int base2) {
  const double x = xf;
  /* clamped to [lo, hi], where the fp32 result is already 0 or inf whatever the error
     below 1e-3: exp(-104) < 2^-150 (half the least subnormal) and exp(89) > 2^128
     (beyond fp32's largest finite); so -inf gives 0 and +inf gives inf. A NaN fails
     both comparisons and propagates through every operation below. */
  const double lo = base2 ? -151.0 : -104.0, hi = base2 ? 129.0 : 89.0;
  double xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  const double a = base2 ? xc * 256.0 : xc * KHI; /* exact */
  const double ks = a + SHIFT;                     /* k + SHIFT: k in its low bits */
  const double k = ks - SHIFT;
  const double h = base2 ? a - k : (a - k) + xc * KLO; /* a - k exact */
  const int64_t kb = bits64(ks) - (bits64(SHIFT) - BIAS); /* k + BIAS >= 0 */
  const double t = T[(int) (kb & 255)];
  const double q = h * (C1 + h * (C2 + h * (C3 + h * C4)));
  /* 2^(k >> 8) is a normal double: multiplying by it is exact */
  const double sc = from64(((kb >> 8) + (1023 - BIAS / 256)) << 52);
  float r = (float) ((t + t * q) * sc);
  /* the hard inputs this evaluation rounds wrongly, if any (native.py finds them) */
  if (base2) {
    @FIX_EXP2@
  } else {
    @FIX_EXP@
  }
  return r;
}

static inline float round_bf16(float p) {
  const uint32_t b = bits32(p);
  const uint32_t r = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u; /* nearest, ties even */
  return (b & 0x7fffffffu) > 0x7f800000u ? p : from32(r);          /* NaN stays NaN */
}

/* one row; base2 and cast are constants at every call, so each loop is branch-free */
static inline __attribute__((always_inline)) void row(const float *sr, float c, float mr,
                                                     float *pr, float *cr, int64_t n,
                                                     const int base2, const int cast) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) {
    const float v = exp_round(sr[j] * c - mr, base2); /* two fp32 roundings (no FMA) */
    pr[j] = v;
    if (cast) cr[j] = round_bf16(v);
  }
}

/* rows x n values: p[r, j] = fp32(exp(s[r, j] * c - m[r])), the product and the difference
   each rounded to fp32 (c = 1: x = s - m); m may be NULL (m = 0) and p may be s. cast: 0
   none, 1 bf16 into pc. */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
void fn_exp_rows(const float *s, float c, const float *m, float *p, float *pc, int64_t rows,
                 int64_t n, int base2, int cast, int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float mr = m ? m[r] : 0.0f;
    const float *sr = s + r * n;
    float *pr = p + r * n, *cr = pc ? pc + r * n : 0;
    switch (base2 * 2 + cast) {
      case 0: row(sr, c, mr, pr, cr, n, 0, 0); break;
      case 1: row(sr, c, mr, pr, cr, n, 0, 1); break;
      case 2: row(sr, c, mr, pr, cr, n, 1, 0); break;
      default: row(sr, c, mr, pr, cr, n, 1, 1); break;
    }
  }
}

/* o[r, j] = o[r, j] * alpha[r] + pv[r, j]: two fp32 roundings, the product first
   (what o.mul_(alpha).add_(pv) does; no FMA). */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
void fn_rescale_add(float *o, const float *alpha, const float *pv, int64_t rows, int64_t n,
                    int nthreads) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
  for (int64_t r = 0; r < rows; ++r) {
    const float a = alpha[r];
    float *orow = o + r * n;
    const float *prow = pv + r * n;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      const float t = orow[j] * a;
      orow[j] = t + prow[j];
    }
  }
}

/* y = bf16(x) as float32 (round to nearest, ties to even; NaN stays NaN, overflow
   gives inf): torch's x.to(bfloat16).to(float32) in one pass. y may be x. */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
void fn_round_bf16(const float *x, float *y, int64_t n, int nthreads) {
  const int64_t block = 1 << 14;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
  for (int64_t b = 0; b < n; b += block) {
    const int64_t e = b + block < n ? b + block : n;
#pragma omp simd
    for (int64_t i = b; i < e; ++i) y[i] = round_bf16(x[i]);
  }
}

/* The softmax state of one fa2 step, row by row, as the torch ops in engine._flash do it:
     m_new = max(m, m_blk)  (NaN if either is NaN)
     n_resc += m_new > m and m finite
     m_safe = m_new if finite, else 0   (fully masked so far: exp(-inf - 0) = 0)
     alpha  = fp32(exp(fl(m - m_safe)))  (exp2 if base2; correctly rounded, as above)
   m is overwritten with m_new. Returns 1 if every m_new is finite. */
static inline __attribute__((always_inline)) int state(float *m, const float *m_blk,
                                                      int64_t *n_resc, float *m_safe,
                                                      float *alpha, int64_t rows,
                                                      const int base2) {
  int finite = 1;
#pragma omp simd reduction(&: finite)
  for (int64_t r = 0; r < rows; ++r) {
    const float a = m[r], b = m_blk[r];
    const float mn = (a != a || b != b) ? a + b : (b > a ? b : a);
    const int fin_a = a - a == 0.0f, fin_n = mn - mn == 0.0f;
    n_resc[r] += (mn > a) & fin_a;
    const float ms = fin_n ? mn : 0.0f;
    m_safe[r] = ms;
    alpha[r] = exp_round(a - ms, base2);
    m[r] = mn;
    finite &= fin_n;
  }
  return finite;
}

__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
int fn_fa2_state(float *m, const float *m_blk, int64_t *n_resc, float *m_safe, float *alpha,
                 int64_t rows, int base2) {
  return base2 ? state(m, m_blk, n_resc, m_safe, alpha, rows, 1)
               : state(m, m_blk, n_resc, m_safe, alpha, rows, 0);
}
