/* Fused kernels for the fp32 carrier (see flashnum/native.py): the exp site first.

   For a float32 x, p = fp32(exp(x)) (or exp2) rounded once to nearest even, and
   optionally pc = P cast of p to bf16 (round to nearest even), in one pass:

       x  = s[r, j] * c - m[r]      fp32 product (c = 1: none) and difference (the site s - m)
       y  = exp(x) in float64       |y - exp(x)| <= ~1.3 ulp of float64 (derivation below)
       p  = (float) y               one round-to-nearest-even into fp32
       pc = bf16(p)                 one round-to-nearest-even

   float64 evaluation, then one rounding: the same model as Arith.exp in
   flashnum/engine.py; the experiment exp_exhaustive checks on every float32 input that
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
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

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

/* float64 exp (base2 = 0) or exp2 (base2 = 1) of a float32 value, before any rounding
   into a narrower format. Branch-free, so that the loops below vectorise. */
static inline double exp_eval(float xf, int base2) {
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
  return (t + t * q) * sc;
}

/* exp_eval rounded to fp32, correctly (see the header) */
static inline float exp_round(float xf, int base2) {
  float r = (float) exp_eval(xf, base2);
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

static inline float round_f16(float p) { return (float) (_Float16) p; }

/* p rounded to 24 - drop significand bits with fp32's exponent range (0 < drop < 24):
   nearest even on the bits, as round_bf16 (drop 16); below 2^-126 the dropped bits are
   those of the format's subnormal spacing 2^(-149 + drop), so the same bits serve; a carry
   past the largest finite gives inf, as Format.round does */
static inline float round_bits(float p, int drop) {
  const uint32_t b = bits32(p);
  const uint32_t r = (b + ((1u << (drop - 1)) - 1u) + ((b >> drop) & 1u)) & ~((1u << drop) - 1u);
  return (b & 0x7fffffffu) > 0x7f800000u ? p : from32(r);
}

/* a site's rounding of an fp32 value: F = 0 fp32 (none), 1 bf16, 2 fp16 (nearest even;
   torch's x.to(dtype).to(float32)) */
static inline __attribute__((always_inline)) float site(float x, const int F) {
  return F == 0 ? x : F == 1 ? round_bf16(x) : round_f16(x);
}

/* a float64 value rounded once into bf16 (F = 1) or fp16 (F = 2), as fp32: what
   Format.round does to the exp site's float64 value (flashnum.numerics.floats: nearest
   even on the bits where normal, on the subnormal spacing below the least normal, and
   inf past the largest finite) */
static inline __attribute__((always_inline)) float round64(double y, const int F) {
  const int drop = F == 1 ? 45 : 42;                /* 53 - p */
  const double tiny = F == 1 ? 0x1p-126 : 0x1p-14;  /* the least normal */
  const double inv_q = F == 1 ? 0x1p133 : 0x1p24;   /* 1 / the least subnormal, q */
  const double q = F == 1 ? 0x1p-133 : 0x1p-24;
  const double big = F == 1 ? 0x1.fep127 : 65504.0; /* the largest finite */
  int64_t b = bits64(y);
  b = (b + ((b >> drop) & 1) + (((int64_t) 1 << (drop - 1)) - 1)) & ~(((int64_t) 1 << drop) - 1);
  double r = from64(b);
  const double a = y < 0 ? -y : y;
  r = a < tiny ? rint(y * inv_q) * q : r;  /* exact scalings by powers of two */
  const double ra = r < 0 ? -r : r;
  r = ra > big ? (y < 0 ? -INFINITY : INFINITY) : r;
  return y != y ? (float) y : (float) r;
}

/* the exp site in format F: fp32 correctly rounded (exp_round), else exp_eval rounded once
   into F (Arith.exp: the float64 exp rounded by Format.round); fused.py checks on every
   input of F that this is the torch path's value */
static inline __attribute__((always_inline)) float exp_site(float x, int base2, const int F) {
  return F == 0 ? exp_round(x, base2) : round64(exp_eval(x, base2), F);
}

/* y[i] = the exp site of x[i] in format F (for fused.py's check) */
void fn_exp_site(const float *x, float *y, int64_t n, int base2, int F) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = F == 1 ? exp_site(x[i], base2, 1) : F == 2 ? exp_site(x[i], base2, 2)
                  : exp_site(x[i], base2, 0);
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

/* ---------------------------------------------------------------------------------------
   The fused forward (flashnum/engine/fused.py): each job, a few query blocks of one head,
   runs through its key blocks in one loop while its tiles are in cache, doing exactly the
   operations of the in-place path (flashnum/engine/fast.py) in its order:

       S   = Q_rows K_j^T                 accumulate.c's chain (fp32 accumulation)
       s   = fl(S * scale), -inf where the key is not visible (ragged or causal)
       m   = max(m, rowmax(s)) (lazy: kept while it grows by <= tau); n_resc; m_safe; alpha
       P   = fp32(exp(fl(s - m_safe))), Pc = cast(P)   (exp_round above: the same values)
       l   = fl(fl(l alpha) + rowsum(P or Pc))          accumulate.c's cascade order
       o   = fl(fl(o alpha) + Pc V_j)                   accumulate.c's chain

   The two GEMMs are accumulate.c's chains (compiled before this file: each entry one FMA
   chain over k from +0), on the path J->isa: AVX-512 runs fn_fused_forward_v4 below, whose
   panels keep S, P and the O update in the first-level cache; AVX2 and scalar run
   fn_fused_forward, the GEMMs through memory. Either gives the same bits. */

typedef struct {
  int isa;                      /* accumulate.c's path: ISA_AVX512, ISA_AVX2, ISA_SCALAR */
  const float *q, *k, *v;       /* (B, n_qb bm, d), (B, n_kb, bn, d), (B, n_kb, bn, dv) */
  const int64_t *perm;          /* (B or 1, n_qb, n_kb): the key block at each step */
  const int64_t *vis;           /* (n_qb bm,): keys visible to each row, a prefix */
  int64_t B, n_qb, bm, g, n_kb, bn, d, dv, perm_b;
  float scale, tau;
  int lazy, base2, cast, l_from_cast;
  float *m, *l, *o, *m_tr, *l_tr; /* state (B, n_qb bm[, dv]); trace (n_kb, B, n_qb bm) */
  int64_t *n_resc;
  const float *kt;              /* (B, n_kb, d, bn): K_j^T, B of the tile GEMM S = Q K_j^T */
  int sites;                    /* F of s, m, p, l, o: 0 fp32 (fa2), 1 bf16, 2 fp16 (lowp) */
  int cast_drop, dot_drop;      /* bits a p-bit P cast (cast 3) and tf32 dots (13) drop */
} fused_job;

/* The softmax step of h rows of logits s (h x bn: S on entry, P on return, Pc in pc), in
   three passes so that the state's exp runs vectorised across rows: per row the scale,
   the mask and the row max; per h rows the state (m, n_resc, the shift, alpha); per row
   P, its cast and l. rg0 is the first row's index among the query rows (for the visible
   prefix), j the key block; m, l, nr and alpha hold one value per row, mb is scratch of
   (2 + SUM_LANES) h. */
static inline __attribute__((always_inline)) void rows_step(
    const fused_job *J, int64_t h, int64_t rg0, int64_t j, float *s, float *pc, float *m,
    float *l, int64_t *nr, float *alpha, float *mb, const int base2, const int cast,
    const int F) {
  const int64_t bn = J->bn;
  const int drop = J->cast_drop;
  float *ms = mb + h, *lanes = ms + h;  /* lanes: SUM_LANES h */
  for (int64_t r = 0; r < h; ++r) {
    float *sr = s + r * bn;
    int64_t nv = J->vis[rg0 + r] - j * bn;  /* visible columns of this row */
    nv = nv < 0 ? 0 : nv > bn ? bn : nv;
    /* s = fl_s(fl_s(S) scale), -inf past the visible prefix */
    for (int64_t c = 0; c < nv; ++c) sr[c] = site(site(sr[c], F) * J->scale, F);
    for (int64_t c = nv; c < bn; ++c) sr[c] = -INFINITY;
    /* its row max, NaN if any logit is NaN (torch.amax): a max is exact in any order, so
       it is taken on the floats' bits mapped to integers of the same order (a reduction
       that vectorises; the mapping puts -0 below +0, and S is never -0: the GEMM sums
       from +0) */
    int32_t km = INT32_MIN;
    uint32_t nan = 0;
    for (int64_t c = 0; c < bn; ++c) {
      const uint32_t b = bits32(sr[c]);
      const int32_t key = (int32_t) (b ^ ((uint32_t) ((int32_t) b >> 31) >> 1));
      km = key > km ? key : km;
      nan |= (b & 0x7fffffffu) > 0x7f800000u;
    }
    const float x = from32((uint32_t) km ^ ((uint32_t) (km >> 31) >> 1));
    mb[r] = nan ? NAN : x;
  }
  /* the state: torch.maximum (NaN if either is), lazy_max, grew, finite_or_zero */
  const int lazy = J->lazy;
  const float tau = J->tau;
#pragma omp simd
  for (int64_t r = 0; r < h; ++r) {
    const float a = m[r], b = mb[r];
    float mn = (a != a || b != b) ? a + b : (b > a ? b : a);
    const int fin_a = a - a == 0.0f;
    mn = lazy && fin_a && mn - a <= tau ? a : mn;
    nr[r] += (mn > a) & fin_a;
    const float shift = mn - mn == 0.0f ? mn : 0.0f;
    m[r] = mn;
    ms[r] = shift;
    alpha[r] = exp_site(site(a - shift, F), base2, F);
  }
  for (int64_t r = 0; r < h; ++r) {
    float *sr = s + r * bn, *pr = pc + r * bn;
    const float shift = ms[r];
    if (cast) {  /* F = 0 */
#pragma omp simd
      for (int64_t c2 = 0; c2 < bn; ++c2) {
        const float p = exp_round(sr[c2] - shift, base2);
        sr[c2] = p;
        pr[c2] = cast == 1 ? round_bf16(p) : cast == 2 ? round_f16(p) : round_bits(p, drop);
      }
    } else {
#pragma omp simd
      for (int64_t c2 = 0; c2 < bn; ++c2)
        sr[c2] = exp_site(site(sr[c2] - shift, F), base2, F);
    }
    const float *xs = J->l_from_cast && cast ? pr : sr;
    if (bn % SUM_LANES == 0) {  /* the lanes now, their sum for all rows below */
      cascade_lanes_float(xs, bn, SUM_LANES, lanes + r, h);
    } else {
      const float lb = site(rowsum_float(xs, bn), F);
      const float la = site(l[r] * alpha[r], F);
      l[r] = site(la + lb, F);
    }
    if (J->dot_drop) {  /* P V's operand as tf32 dots read it (Arith.dot), into pc */
      const float *x = cast ? pr : sr;
      for (int64_t c2 = 0; c2 < bn; ++c2) pr[c2] = round_bits(x[c2], J->dot_drop);
    }
  }
  if (bn % SUM_LANES == 0) {
    /* cascade_rowsum_float's last steps, row by row in the same order (0 + each lane, then the
       output's 0 + r; no tail), vectorised across rows; then l */
#pragma omp simd
    for (int64_t r = 0; r < h; ++r) {
      float x = 0.0f;
      for (int e = 0; e < SUM_LANES; ++e) x += lanes[e * h + r];
      const float lb = site(0.0f + x, F);
      const float la = site(l[r] * alpha[r], F);
      l[r] = site(la + lb, F);
    }
  }
}

/* The start of a job: its rows' state, and where its rows, key order and outputs lie. */
typedef struct {
  int64_t R, r0, row0;
  const float *q;
  float *m, *l, *o;
  int64_t *nr;
  const int64_t *perm;
} fused_rows;

static fused_rows job_rows(const fused_job *J, int64_t b, int64_t qb0) {
  const int64_t nqb = J->g < J->n_qb - qb0 ? J->g : J->n_qb - qb0;
  fused_rows w;
  w.R = nqb * J->bm;
  w.r0 = qb0 * J->bm;
  w.row0 = b * J->n_qb * J->bm + w.r0;
  w.q = J->q + w.row0 * J->d;
  w.m = J->m + w.row0; w.l = J->l + w.row0; w.o = J->o + w.row0 * J->dv;
  w.nr = J->n_resc + w.row0;
  w.perm = J->perm + ((J->perm_b ? b : 0) * J->n_qb + qb0) * J->n_kb;
  for (int64_t r = 0; r < w.R; ++r) { w.m[r] = -INFINITY; w.l[r] = 0.0f; w.nr[r] = 0; }
  for (int64_t e = 0; e < w.R * J->dv; ++e) w.o[e] = 0.0f;
  return w;
}

static inline void trace_step(const fused_job *J, const fused_rows *w, int64_t t) {
  if (J->m_tr) {
    const int64_t off = t * J->B * J->n_qb * J->bm + w->row0;
    for (int64_t r = 0; r < w->R; ++r) { J->m_tr[off + r] = w->m[r]; J->l_tr[off + r] = w->l[r]; }
  }
}

static inline __attribute__((always_inline)) void fused_block(
    const fused_job *J, int64_t b, int64_t qb0, float *s, float *pc, float *pv,
    float *alpha, const int base2, const int cast, const int F) {
  const int64_t bn = J->bn, d = J->d, dv = J->dv;
  const fused_rows w = job_rows(J, b, qb0);
  const int64_t R = w.R;
  for (int64_t t = 0; t < J->n_kb; ++t) {
    const int64_t j = w.perm[t];
    const float *ktj = J->kt + (b * J->n_kb + j) * d * bn;
    const float *vj = J->v + (b * J->n_kb + j) * bn * dv;
    chain_float(J->isa, w.q, d, 1, ktj, bn, s, bn, R, bn, d);
    rows_step(J, R, w.r0, j, s, pc, w.m, w.l, w.nr, alpha, alpha + R, base2, cast, F);
    chain_float(J->isa, J->cast || J->dot_drop ? pc : s, bn, 1, vj, dv, pv, dv, R, dv, bn);
    for (int64_t r = 0; r < R; ++r) {
      const float ar = alpha[r];
      float *orow = w.o + r * dv;
      const float *prow = pv + r * dv;
#pragma omp simd
      for (int64_t c = 0; c < dv; ++c) {
        const float x = site(orow[c] * ar, F);
        orow[c] = site(x + site(prow[c], F), F);
      }
    }
    trace_step(J, &w, t);
  }
}

/* x86-64-v3: AVX2 with F16C, so that the fp16 cast of P is an instruction, not a call (CPUs
   with AVX-512 run fn_fused_forward_v4 below; one clone fewer keeps the build short) */
__attribute__((target_clones("arch=x86-64-v3", "default")))
void fn_fused_forward(const fused_job *J, int nthreads) {
  const int64_t n_groups = (J->n_qb + J->g - 1) / J->g, jobs = J->B * n_groups;
  const int64_t rows = J->g * J->bm;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    float *buf = aligned_alloc(64, ((2 * rows * J->bn + rows * J->dv + 11 * rows) * 4 + 63)
                                       / 64 * 64);
    float *s = buf, *pc = s + rows * J->bn, *pv = pc + rows * J->bn;
    float *alpha = pv + rows * J->dv;
#pragma omp for schedule(dynamic, 1)
    for (int64_t job = 0; job < jobs; ++job) {
      const int64_t b = job / n_groups, qb0 = (job % n_groups) * J->g;
      switch (J->sites * 8 + J->base2 * 4 + J->cast) {  /* each compiled for its constants */
        case 0: fused_block(J, b, qb0, s, pc, pv, alpha, 0, 0, 0); break;
        case 1: fused_block(J, b, qb0, s, pc, pv, alpha, 0, 1, 0); break;
        case 2: fused_block(J, b, qb0, s, pc, pv, alpha, 0, 2, 0); break;
        case 3: fused_block(J, b, qb0, s, pc, pv, alpha, 0, 3, 0); break;
        case 4: fused_block(J, b, qb0, s, pc, pv, alpha, 1, 0, 0); break;
        case 5: fused_block(J, b, qb0, s, pc, pv, alpha, 1, 1, 0); break;
        case 6: fused_block(J, b, qb0, s, pc, pv, alpha, 1, 2, 0); break;
        case 7: fused_block(J, b, qb0, s, pc, pv, alpha, 1, 3, 0); break;
        case 8: fused_block(J, b, qb0, s, pc, pv, alpha, 0, 0, 1); break;
        case 12: fused_block(J, b, qb0, s, pc, pv, alpha, 1, 0, 1); break;
        case 16: fused_block(J, b, qb0, s, pc, pv, alpha, 0, 0, 2); break;
        default: fused_block(J, b, qb0, s, pc, pv, alpha, 1, 0, 2); break;  /* 20 */
      }
    }
    free(buf);
  }
}


/* ---------------------------------------------------------------------------------------
   The same loop on AVX-512 (accumulate.c's ISA_AVX512): a panel of query rows goes through
   S = Q K_j^T, its softmax step and O = O alpha + P V_j (the update fused into the chain's
   store, chain512_float's rescale) while it is in the first-level cache. */
#define PANEL 48 /* rows per panel: a multiple of every MR16 of accumulate.c */

static inline __attribute__((always_inline)) V4 void fused_panels(
    const fused_job *J, int64_t b, int64_t qb0, float *s, float *pc, float *alpha,
    const int base2, const int cast, const int F) {
  const int64_t bn = J->bn, d = J->d, dv = J->dv;
  const fused_rows w = job_rows(J, b, qb0);
  float *p = cast || J->dot_drop ? pc : s;
  for (int64_t t = 0; t < J->n_kb; ++t) {
    const int64_t j = w.perm[t];
    const float *ktj = J->kt + (b * J->n_kb + j) * d * bn;
    const float *vj = J->v + (b * J->n_kb + j) * bn * dv;
    for (int64_t r0 = 0; r0 < w.R; r0 += PANEL) {
      const int64_t h = w.R - r0 < PANEL ? w.R - r0 : PANEL;
      chain512_float(w.q + r0 * d, d, 1, ktj, bn, s, bn, h, bn, d, 0, 0);
      rows_step(J, h, w.r0 + r0, j, s, pc, w.m + r0, w.l + r0, w.nr + r0, alpha, alpha + PANEL,
                base2, cast, F);
      chain512_float(p, bn, 1, vj, dv, w.o + r0 * dv, dv, h, dv, bn, alpha, 1 + F);
    }
    trace_step(J, &w, t);
  }
}

/* fn_fused_forward on AVX-512's panels; 0 if the job's path is not ISA_AVX512 (nothing run),
   else 1 */
int fn_fused_forward_v4(const fused_job *J, int nthreads);
static V4 void fused_v4(const fused_job *J, int nthreads) {
  const int64_t n_groups = (J->n_qb + J->g - 1) / J->g, jobs = J->B * n_groups;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    float *buf = aligned_alloc(64, (2 * PANEL * J->bn + 11 * PANEL) * 4 / 64 * 64 + 64);
    float *s = buf, *pc = s + PANEL * J->bn, *alpha = pc + PANEL * J->bn;
#pragma omp for schedule(dynamic, 1)
    for (int64_t job = 0; job < jobs; ++job) {
      const int64_t b = job / n_groups, qb0 = (job % n_groups) * J->g;
      switch (J->sites * 8 + J->base2 * 4 + J->cast) {  /* each compiled for its constants */
        case 0: fused_panels(J, b, qb0, s, pc, alpha, 0, 0, 0); break;
        case 1: fused_panels(J, b, qb0, s, pc, alpha, 0, 1, 0); break;
        case 2: fused_panels(J, b, qb0, s, pc, alpha, 0, 2, 0); break;
        case 3: fused_panels(J, b, qb0, s, pc, alpha, 0, 3, 0); break;
        case 4: fused_panels(J, b, qb0, s, pc, alpha, 1, 0, 0); break;
        case 5: fused_panels(J, b, qb0, s, pc, alpha, 1, 1, 0); break;
        case 6: fused_panels(J, b, qb0, s, pc, alpha, 1, 2, 0); break;
        case 7: fused_panels(J, b, qb0, s, pc, alpha, 1, 3, 0); break;
        case 8: fused_panels(J, b, qb0, s, pc, alpha, 0, 0, 1); break;
        case 12: fused_panels(J, b, qb0, s, pc, alpha, 1, 0, 1); break;
        case 16: fused_panels(J, b, qb0, s, pc, alpha, 0, 0, 2); break;
        default: fused_panels(J, b, qb0, s, pc, alpha, 1, 0, 2); break;  /* 20 */
      }
    }
    free(buf);
  }
}

int fn_fused_forward_v4(const fused_job *J, int nthreads) {
  if (J->isa != ISA_AVX512) return 0;
  fused_v4(J, nthreads);
  return 1;
}
