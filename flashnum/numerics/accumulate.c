/* flashnum's own order for every dot product and row sum (flashnum/numerics/accumulate.py).

   A dot product c = sum_k a_k b_k accumulated in fp32 (fp64) is ONE chain of fused
   multiply-adds over k in order, from +0:

       c = +0;  for k = 0, 1, ..., K-1:  c = fma(a_k, b_k, c)   (each fma rounded once)

   and a row sum is ATen's cascade order with a fixed lane count (cascade_lanes below:
   L = 8 for fp32, L = 4 for fp64, whatever the CPU's vector width). Both are defined
   element by element: the vector code below only computes several independent chains
   (columns of C, lanes of a sum) side by side, so the AVX-512, AVX2 and scalar paths give
   the same bits, at any thread count (every output element is one thread's) and any
   memory layout (the operands' strides change where a value is read, not the order in
   which it is added). Compiled with -ffp-contract=off: no operation is contracted except
   the fma written here. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

/* the best path this CPU runs (x86: x86-64-v4, AVX-512; else x86-64-v3, AVX2 with FMA;
   else scalar; other machines: scalar, whose fma is the hardware's or the C library's
   exact one) */
int fn_best_isa(void) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("x86-64-v4")) return ISA_AVX512;
  if (__builtin_cpu_supports("x86-64-v3")) return ISA_AVX2;
#endif
  return ISA_SCALAR;
}

/* ---------------------------------------------------------------------------------------
   The chain, scalar: one row of C at a time, every column's chain advanced by one k per
   pass (the compiler may run the columns in vector lanes: fma per lane is the same fma). */
#define CHAIN_SCALAR(T, FMA)                                                                 \
  static void chain_scalar_##T(const T *a, int64_t sam, int64_t sak, const T *b,           \
                               int64_t ldb, T *c, int64_t ldc, int64_t M, int64_t N,       \
                               int64_t K) {                                                 \
    for (int64_t m = 0; m < M; ++m) {                                                       \
      T *cr = c + m * ldc;                                                                  \
      for (int64_t n = 0; n < N; ++n) cr[n] = (T) 0;                                        \
      for (int64_t k = 0; k < K; ++k) {                                                     \
        const T x = a[m * sam + k * sak];                                                   \
        const T *br = b + k * ldb;                                                          \
        for (int64_t n = 0; n < N; ++n) cr[n] = FMA(x, br[n], cr[n]);                       \
      }                                                                                     \
    }                                                                                       \
  }
CHAIN_SCALAR(float, fmaf)
CHAIN_SCALAR(double, fma)

#if defined(__x86_64__)
#include <immintrin.h>

/* ---------------------------------------------------------------------------------------
   The chain in registers: MR rows by NV vectors of columns, the K chain of each of their
   MR x NV x lanes elements held in an accumulator from +0 to the end. One function per
   (NV) so that its accumulators stay in registers. A may have any strides (its element is
   broadcast); B and C are unit-stride along the columns. */

/* AVX-512: 16 (fp32) or 8 (fp64) lanes; NV <= 8 vectors (128 or 64 columns), MR rows by NV
   so that MR NV + NV + 1 <= 32 registers */
#define MR16(NV) ((NV) <= 2 ? 8 : (NV) <= 4 ? 6 : (NV) <= 6 ? 4 : 3)
#define V4 __attribute__((target("arch=x86-64-v4")))

/* a site's rounding on 16 fp32 lanes: F = 0 none, 1 bf16, 2 fp16 (nearest even; NaN kept) */
static inline V4 __m512 site_v(__m512 x, const int F) {
  if (F == 1) {
    const __m512i b = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_and_si512(
        _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), odd),
        _mm512_set1_epi32((int) 0xffff0000u));
    return _mm512_mask_mov_ps(_mm512_castsi512_ps(r), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q),
                              x);
  }
  if (F == 2)
    return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return x;
}

/* the store of one accumulator: plain, or (fp32, rescale = 1 + F) the fused update of an
   fa2 step, C = fl(fl(C alpha) + fl(sum)) with each fl the site's rounding into F
   (fp32: o.mul_(alpha).add_(pv), two roundings; flashnum/engine/native.c's fused loop) */
#define STORE512_float(cr, mk, x, al, rescale)                                               \
  do {                                                                                       \
    __m512 x_ = (x);                                                                         \
    if (rescale) {                                                                           \
      const int F_ = (rescale) - 1;                                                          \
      const __m512 o_ = site_v(                                                              \
          _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, cr), _mm512_set1_ps(al)), F_);            \
      x_ = site_v(_mm512_add_ps(o_, site_v(x_, F_)), F_);                                    \
    }                                                                                        \
    _mm512_mask_storeu_ps(cr, mk, x_);                                                       \
  } while (0)
#define STORE512_double(cr, mk, x, al, rescale) _mm512_mask_storeu_pd(cr, mk, x)

#define PANEL512(T, VT, LANES, MASKT, SETZERO, LOADU, MLOADZ, SET1, FMADD)                   \
  static inline __attribute__((always_inline)) V4 void panel512_##T(                           \
      const T *a, int64_t sam, int64_t sak, const T *b, int64_t ldb, T *c, int64_t ldc,      \
      int64_t N, int64_t K, const float *alpha, int mr, const int NV, const int MR,          \
      const int rescale) {                                                                    \
    const int64_t last = N - LANES * (NV - 1);                                                \
    const MASKT tail = last >= LANES ? (MASKT) ~0u : (MASKT) ((1u << last) - 1);              \
    VT acc[8][8];                                                                             \
    _Pragma("GCC unroll 8") for (int r = 0; r < MR; ++r)                                      \
      _Pragma("GCC unroll 8") for (int v = 0; v < NV; ++v) acc[r][v] = SETZERO();             \
    for (int64_t k = 0; k < K; ++k) {                                                         \
      VT bv[8];                                                                               \
      _Pragma("GCC unroll 8") for (int v = 0; v < NV; ++v)                                    \
        bv[v] = v < NV - 1 ? LOADU(b + k * ldb + LANES * v)                                   \
                           : MLOADZ(tail, b + k * ldb + LANES * v);                           \
      _Pragma("GCC unroll 8") for (int r = 0; r < MR; ++r) {                                  \
        if (r < mr) {                                                                         \
          const VT ar = SET1(a[r * sam + k * sak]);                                           \
          _Pragma("GCC unroll 8") for (int v = 0; v < NV; ++v)                                \
            acc[r][v] = FMADD(ar, bv[v], acc[r][v]);                                          \
        }                                                                                     \
      }                                                                                       \
    }                                                                                         \
    _Pragma("GCC unroll 8") for (int r = 0; r < MR; ++r) {                                    \
      if (r >= mr) break;                                                                     \
      _Pragma("GCC unroll 8") for (int v = 0; v < NV; ++v)                                    \
        STORE512_##T(c + r * ldc + LANES * v, v < NV - 1 ? (MASKT) ~0u : tail, acc[r][v],     \
                     rescale ? alpha[r] : 0.0f, rescale);                                     \
    }                                                                                         \
  }
PANEL512(float, __m512, 16, __mmask16, _mm512_setzero_ps, _mm512_loadu_ps,
         _mm512_maskz_loadu_ps, _mm512_set1_ps, _mm512_fmadd_ps)
PANEL512(double, __m512d, 8, __mmask8, _mm512_setzero_pd, _mm512_loadu_pd,
         _mm512_maskz_loadu_pd, _mm512_set1_pd, _mm512_fmadd_pd)

/* one function per (NV, rescale), each holding its accumulators in registers (one
   function for all of them spills them to the stack) */
typedef void (*panel_fn_f)(const float *, int64_t, int64_t, const float *, int64_t, float *,
                           int64_t, int64_t, int64_t, const float *, int);
typedef void (*panel_fn_d)(const double *, int64_t, int64_t, const double *, int64_t,
                           double *, int64_t, int64_t, int64_t, const float *, int);
#define PANEL512_FN(T, NV, RS)                                                                \
  static V4 void p512_##T##_##NV##_##RS(const T *a, int64_t sam, int64_t sak, const T *b,    \
                                        int64_t ldb, T *c, int64_t ldc, int64_t N, int64_t K, \
                                        const float *alpha, int mr) {                         \
    panel512_##T(a, sam, sak, b, ldb, c, ldc, N, K, alpha, mr, NV, MR16(NV), RS);             \
  }
#define PANEL512_FNS(T, RS) PANEL512_FN(T, 1, RS) PANEL512_FN(T, 2, RS) PANEL512_FN(T, 3, RS) \
  PANEL512_FN(T, 4, RS) PANEL512_FN(T, 5, RS) PANEL512_FN(T, 6, RS) PANEL512_FN(T, 7, RS)     \
  PANEL512_FN(T, 8, RS)
#define PANEL512_ROW(T, RS) {p512_##T##_1_##RS, p512_##T##_2_##RS, p512_##T##_3_##RS,         \
  p512_##T##_4_##RS, p512_##T##_5_##RS, p512_##T##_6_##RS, p512_##T##_7_##RS,                 \
  p512_##T##_8_##RS}
PANEL512_FNS(float, 0) PANEL512_FNS(float, 1) PANEL512_FNS(float, 2) PANEL512_FNS(float, 3)
PANEL512_FNS(double, 0)
static const panel_fn_f P512F[4][8] = {PANEL512_ROW(float, 0), PANEL512_ROW(float, 1),
                                       PANEL512_ROW(float, 2), PANEL512_ROW(float, 3)};
static const panel_fn_d P512D[1][8] = {PANEL512_ROW(double, 0)};

/* AVX2 with FMA (x86-64-v3): 8 (fp32) or 4 (fp64) lanes, NV <= 2, MR 6 (12 accumulators of 16 ymm) */
#define V3 __attribute__((target("arch=x86-64-v3")))
#define PANEL256(T, VT, LANES, SETZERO, LOADU, MLOAD, SET1, FMADD, MSTORE, MASKV)             \
  static V3 void panel256_##T(const T *a, int64_t sam, int64_t sak, const T *b, int64_t ldb, \
                              T *c, int64_t ldc, int64_t N, int64_t K, int mr) {             \
    const int NV = N > LANES ? 2 : 1;                                                         \
    const __m256i tail = MASKV(N - LANES * (NV - 1));                                         \
    VT acc[6][2];                                                                             \
    for (int r = 0; r < 6; ++r) acc[r][0] = acc[r][1] = SETZERO();                           \
    for (int64_t k = 0; k < K; ++k) {                                                         \
      const T *bk = b + k * ldb;                                                              \
      VT b0 = NV == 1 ? MLOAD(bk, tail) : LOADU(bk);                                          \
      VT b1 = NV == 2 ? MLOAD(bk + LANES, tail) : SETZERO();                                  \
      for (int r = 0; r < 6; ++r) {                                                           \
        if (r < mr) {                                                                         \
          const VT ar = SET1(a[r * sam + k * sak]);                                           \
          acc[r][0] = FMADD(ar, b0, acc[r][0]);                                               \
          if (NV == 2) acc[r][1] = FMADD(ar, b1, acc[r][1]);                                  \
        }                                                                                     \
      }                                                                                       \
    }                                                                                         \
    const __m256i all = MASKV(LANES);                                                         \
    for (int r = 0; r < mr; ++r) {                                                            \
      MSTORE(c + r * ldc, NV == 1 ? tail : all, acc[r][0]);                                   \
      if (NV == 2) MSTORE(c + r * ldc + LANES, tail, acc[r][1]);                              \
    }                                                                                         \
  }
/* lanes l < n get the high bit set: _mm256_maskload/maskstore read and write only those */
static inline V3 __m256i mask8(int64_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int) n), idx);
}
static inline V3 __m256i mask4(int64_t n) {
  const __m256i idx = _mm256_setr_epi64x(0, 1, 2, 3);
  return _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), idx);
}
PANEL256(float, __m256, 8, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_maskload_ps,
         _mm256_set1_ps, _mm256_fmadd_ps, _mm256_maskstore_ps, mask8)
PANEL256(double, __m256d, 4, _mm256_setzero_pd, _mm256_loadu_pd, _mm256_maskload_pd,
         _mm256_set1_pd, _mm256_fmadd_pd, _mm256_maskstore_pd, mask4)

/* rows x N of C = A B in strips of columns (AVX-512: 8 vectors, AVX2: 2), MR rows at a
   time; AVX-512 fp32 also the fused update of an fa2 step (rescale = 1 + F, alpha one
   value per row) */
#define CHAIN_ROWS(T, W512, W256, PANELS)                                                    \
  static V4 void chain512_##T(const T *a, int64_t sam, int64_t sak, const T *b, int64_t ldb, \
                              T *c, int64_t ldc, int64_t M, int64_t N, int64_t K,            \
                              const float *alpha, int rescale) {                             \
    for (int64_t n0 = 0; n0 < N; n0 += W512) {                                               \
      const int64_t w = N - n0 < W512 ? N - n0 : W512;                                        \
      const int nv = (int) ((w + W512 / 8 - 1) / (W512 / 8)), mr = MR16(nv);                  \
      const typeof(PANELS[0][0]) f = PANELS[rescale][nv - 1];                                 \
      for (int64_t r = 0; r < M; r += mr)                                                     \
        f(a + r * sam, sam, sak, b + n0, ldb, c + r * ldc + n0, ldc, w, K,                   \
          alpha ? alpha + r : 0, M - r < mr ? (int) (M - r) : mr);                            \
    }                                                                                         \
  }                                                                                           \
  static V3 void chain256_##T(const T *a, int64_t sam, int64_t sak, const T *b, int64_t ldb, \
                              T *c, int64_t ldc, int64_t M, int64_t N, int64_t K) {          \
    for (int64_t n0 = 0; n0 < N; n0 += W256) {                                               \
      const int64_t w = N - n0 < W256 ? N - n0 : W256;                                        \
      for (int64_t r = 0; r < M; r += 6)                                                      \
        panel256_##T(a + r * sam, sam, sak, b + n0, ldb, c + r * ldc + n0, ldc, w, K,        \
                     M - r < 6 ? (int) (M - r) : 6);                                          \
    }                                                                                         \
  }
CHAIN_ROWS(float, 128, 16, P512F)
CHAIN_ROWS(double, 64, 8, P512D)
#endif

/* rows x N of C = A B by the path `isa` (each element one fma chain from +0, any path) */
#define CHAIN(T)                                                                             \
  static void chain_##T(int isa, const T *a, int64_t sam, int64_t sak, const T *b,          \
                        int64_t ldb, T *c, int64_t ldc, int64_t M, int64_t N, int64_t K) {  \
    if (K == 0) {                                                                            \
      for (int64_t m = 0; m < M; ++m) memset(c + m * ldc, 0, (size_t) N * sizeof(T));      \
      return;                                                                                \
    }                                                                                        \
    CHAIN_X86(T)                                                                             \
    chain_scalar_##T(a, sam, sak, b, ldb, c, ldc, M, N, K);                                  \
  }
#if defined(__x86_64__)
#define CHAIN_X86(T)                                                                         \
  if (isa == ISA_AVX512) { chain512_##T(a, sam, sak, b, ldb, c, ldc, M, N, K, 0, 0); return; }    \
  if (isa == ISA_AVX2) { chain256_##T(a, sam, sak, b, ldb, c, ldc, M, N, K); return; }
#else
#define CHAIN_X86(T)
#endif
CHAIN(float)
CHAIN(double)

#define PANEL_ROWS 48 /* rows per parallel job */

/* C[i] = A[i] B[i] for i < batch: A (M x K) with strides (sam, sak), B (K x N) with row
   stride ldb, C (M x N) contiguous; batch strides sa, sb, sc (0: shared). Jobs of PANEL_ROWS
   rows over torch's OpenMP threads: each element is one job's, so the bits do not depend
   on the thread count. */
#define FN_CHAIN(T, NAME)                                                                    \
  void NAME(const T *a, const T *b, T *c, int64_t batch, int64_t M, int64_t N, int64_t K,   \
            int64_t sa, int64_t sam, int64_t sak, int64_t sb, int64_t ldb, int64_t sc,       \
            int isa, int nthreads) {                                                         \
    const int64_t per = (M + PANEL_ROWS - 1) / PANEL_ROWS, jobs = batch * per;              \
    _Pragma("omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)")    \
    for (int64_t j = 0; j < jobs; ++j) {                                                     \
      const int64_t i = j / per, r0 = (j % per) * PANEL_ROWS;                                \
      const int64_t rows = M - r0 < PANEL_ROWS ? M - r0 : PANEL_ROWS;                        \
      chain_##T(isa, a + i * sa + r0 * sam, sam, sak, b + i * sb, ldb, c + i * sc + r0 * N, \
                N, rows, N, K);                                                              \
    }                                                                                        \
  }
FN_CHAIN(float, fn_chain_f32)
FN_CHAIN(double, fn_chain_f64)

/* ---------------------------------------------------------------------------------------
   Row sums: ATen's cascade order (aten/src/ATen/native/cpu/SumKernel.cpp, cascade_sum with
   vectorized_inner_sum), with L lanes fixed (8 for fp32, 4 for fp64: torch's 256-bit
   Vectorized, which its AVX-512 build also uses for sums): L-wide partial sums in four
   interleaved accumulators (ilp 4) with the cascade's levels, their sum
   ((a0 + a1) + a2) + a3, then the tail values one by one, then the lanes one by one,
   and the result added to the output's +0. Rows shorter than L: the same with scalars
   (L = 1). Each lane is its own chain, so vectorising the lane loops changes no bit. */
static int ceil_log2_i(int64_t x) {
  if (x <= 2) return 1;
  int b = 0;
  uint64_t y = (uint64_t) (x - 1);
  while (y) { ++b; y >>= 1; }
  return b;
}

#define CASCADE(T, LMAX)                                                                     \
  static inline __attribute__((always_inline)) void cascade_lanes_##T(                      \
      const T *x, int64_t n, const int L, T *lanes, int64_t stride) {                       \
    const int64_t size = n / L, size_ilp = size / 4;                                         \
    int lp = ceil_log2_i(size_ilp) / 4;                                                      \
    lp = lp > 4 ? lp : 4;                                                                    \
    const int64_t step = (int64_t) 1 << lp, mask = step - 1;                                 \
    T acc[4][4][LMAX];                                                                       \
    for (int a = 0; a < 4; ++a)                                                              \
      for (int k = 0; k < 4; ++k)                                                            \
        for (int e = 0; e < L; ++e) acc[a][k][e] = (T) 0;                                    \
    int64_t i = 0;                                                                           \
    while (i + step <= size_ilp) {                                                           \
      for (int64_t j = 0; j < step; ++j, ++i)                                                \
        for (int k = 0; k < 4; ++k)                                                          \
          for (int e = 0; e < L; ++e) acc[0][k][e] += x[(i * 4 + k) * L + e];                \
      for (int a = 1; a < 4; ++a) {                                                          \
        for (int k = 0; k < 4; ++k)                                                          \
          for (int e = 0; e < L; ++e) {                                                      \
            acc[a][k][e] += acc[a - 1][k][e];                                                \
            acc[a - 1][k][e] = (T) 0;                                                        \
          }                                                                                  \
        if ((i & (mask << (a * lp))) != 0) break;                                            \
      }                                                                                      \
    }                                                                                        \
    for (; i < size_ilp; ++i)                                                                \
      for (int k = 0; k < 4; ++k)                                                            \
        for (int e = 0; e < L; ++e) acc[0][k][e] += x[(i * 4 + k) * L + e];                  \
    for (int a = 1; a < 4; ++a)                                                              \
      for (int k = 0; k < 4; ++k)                                                            \
        for (int e = 0; e < L; ++e) acc[0][k][e] += acc[a][k][e];                            \
    for (int64_t v = size_ilp * 4; v < size; ++v)                                            \
      for (int e = 0; e < L; ++e) acc[0][0][e] += x[v * L + e];                              \
    for (int k = 1; k < 4; ++k)                                                              \
      for (int e = 0; e < L; ++e) acc[0][0][e] += acc[0][k][e];                              \
    for (int e = 0; e < L; ++e) lanes[e * stride] = acc[0][0][e];                            \
  }                                                                                          \
  static inline __attribute__((always_inline)) T cascade_rowsum_##T(const T *x, int64_t n,  \
                                                                    const int L) {           \
    T lanes[LMAX];                                                                           \
    cascade_lanes_##T(x, n, L, lanes, 1);                                                    \
    if (L == 1) return (T) 0 + lanes[0];                                                     \
    T r = (T) 0;                                                                             \
    for (int64_t k = (n / L) * L; k < n; ++k) r += x[k];                                     \
    for (int e = 0; e < L; ++e) r += lanes[e];                                               \
    return (T) 0 + r;                                                                        \
  }                                                                                          \
  static inline T rowsum_##T(const T *x, int64_t n) {                                       \
    return n >= LMAX ? cascade_rowsum_##T(x, n, LMAX) : cascade_rowsum_##T(x, n, 1);        \
  }                                                                                          \
  void fn_rowsum_##T(const T *x, T *out, int64_t rows, int64_t n, int nthreads) {          \
    _Pragma("omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)")    \
    for (int64_t r = 0; r < rows; ++r) out[r] = rowsum_##T(x + r * n, n);                    \
  }
#define SUM_LANES 8 /* fp32's L, also the fused loops' (flashnum/engine/native.c) */
CASCADE(float, 8)
CASCADE(double, 4)
