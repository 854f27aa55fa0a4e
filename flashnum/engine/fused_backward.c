/* The fused backward (flashnum/engine/fused_backward.py), compiled after accumulate.c's and
   native.c's text: it uses accumulate.c's chain_float and rowsum_float and native.c's
   exp_round, round_bf16 and round_f16.

   One job per (batch, head), on torch's OpenMP threads. A job runs FlashAttention-2's
   Algorithm 2 over its head with the key blocks outer (in dQ's order, `perm`) and the query
   blocks inner, doing exactly the operations of the torch loop in
   flashnum.engine.backward._flash, in its order for every accumulation:

       S   = Q_rows K_j^T,  dP = dO_rows V_j^T   accumulate.c's chains (fp32 accumulation)
       x   = fl(S scale), -inf where the key is not visible (ragged, padded or causal)
       P   = fp32(exp(fl(x - L)))   (exp2 with base2); Pc = cast(P)
       dS  = fl(fl(dP - D) P);      dSc = cast(dS);  ds_rowsum = fl(ds_rowsum + rowsum(dSc))
       dV_j = T_0 then fl(dV_j + T_i), T_i = Pc_i^T dO_i   (query blocks i in order)
       dK_j = T_0 then fl(dK_j + T_i), T_i = dSc_i^T Q_i
       dQ_rows = fl(dQ_rows + dSc K_j)               (key blocks in perm's order)

   One job holds all of a head's dQ accumulation, so dQ's order of key blocks is perm's
   whatever the number of threads (flash-attn adds with atomics instead: that order is the
   model's dq_order). Every GEMM is accumulate.c's chain (each entry one FMA chain over k
   from +0, the torch loop's flashnum.numerics.accumulate.dot) on the path J->isa, and
   rowsum(dS) its cascade (accumulate.rowsum): the same bits on every path. */

typedef struct {
  int isa;                                     /* accumulate.c's path */
  const float *q, *k, *v, *dout, *lse, *delta; /* (B, nqp, d|dv), (B, nkp, d|dv), (B, nqp) */
  const float *kt, *vt;                        /* (B, n_kb, d|dv, bn): K_j^T, V_j^T */
  const int64_t *perm;                         /* (n_kb,): the key block at each step */
  const int64_t *vis;                          /* (nqp,): keys visible to each row, a prefix */
  int64_t B, nqp, nkp, bm, bn, d, dv, n_kb, g; /* g query blocks per GEMM of S, dP, dQ */
  float scale;
  int base2, p_cast, ds_cast;                  /* casts: 0 none (fp32), 1 bf16, 2 fp16 */
  float *dq, *dk, *dvv, *ds_rowsum;            /* accumulators; ds_rowsum may be NULL */
} bwd_job;

static inline __attribute__((always_inline)) float bwd_cast(float x, const int cast) {
  return cast == 1 ? round_bf16(x) : cast == 2 ? round_f16(x) : x;
}

/* P, Pc, dS and dSc of R rows starting at row r0 of head b for key block j; s holds S
   and becomes P, dp holds dP and becomes dS (in place, as the torch loop's fused branch) */
static inline __attribute__((always_inline)) void bwd_rows(
    const bwd_job *J, int64_t b, int64_t j, int64_t r0, int64_t R, float *s, float *pc,
    float *dp, float *dsc, const int base2, const int pcast, const int dscast) {
  const int64_t bn = J->bn, row0 = b * J->nqp + r0;
  const float scale = J->scale;
  for (int64_t r = 0; r < R; ++r) {
    int64_t nv = J->vis[r0 + r] - j * bn;
    nv = nv < 0 ? 0 : nv > bn ? bn : nv;
    const float L = J->lse[row0 + r], D = J->delta[row0 + r];
    float *sr = s + r * bn, *pr = pc + r * bn, *dpr = dp + r * bn, *cr = dsc + r * bn;
#pragma omp simd
    for (int64_t c = 0; c < bn; ++c) {
      const float x = c < nv ? sr[c] * scale : -INFINITY; /* masked: -inf * scale */
      const float p = exp_round(x - L, base2);
      const float diff = dpr[c] - D;
      const float ds = diff * p;
      sr[c] = p;
      pr[c] = bwd_cast(p, pcast);
      dpr[c] = ds;
      cr[c] = bwd_cast(ds, dscast);
    }
    if (J->ds_rowsum) {
      const float t = rowsum_float(dscast ? cr : dpr, bn);
      J->ds_rowsum[row0 + r] = J->ds_rowsum[row0 + r] + t;
    }
  }
}

/* acc = T (the first query block) or fl(acc + T): one tile's product stored, then added;
   T = X^T Y, X (k x m) and Y (k x n) row-major (X^T read in place: strides 1 and m) */
static inline void bwd_tile(const bwd_job *J, int first, int64_t m, int64_t n, int64_t k,
                            const float *x, const float *y, float *acc, float *tmp) {
  chain_float(J->isa, x, 1, m, y, n, first ? acc : tmp, n, m, n, k);
  if (!first) {
#pragma omp simd
    for (int64_t e = 0; e < m * n; ++e) acc[e] = acc[e] + tmp[e];
  }
}

static inline __attribute__((always_inline)) void bwd_head(
    const bwd_job *J, int64_t b, float *s, float *pc, float *dp, float *dsc, float *tq,
    float *tmp, const int base2, const int pcast, const int dscast) {
  const int64_t bm = J->bm, bn = J->bn, d = J->d, dv = J->dv, rows = J->g * bm;
  const float *q = J->q + b * J->nqp * d, *dout = J->dout + b * J->nqp * dv;
  float *dq = J->dq + b * J->nqp * d;
  for (int64_t t = 0; t < J->n_kb; ++t) {
    const int64_t j = J->perm[t], key0 = b * J->nkp + j * bn;
    const float *kj = J->k + key0 * d;
    const float *ktj = J->kt + key0 * d, *vtj = J->vt + key0 * dv; /* (d|dv) x bn */
    float *dkj = J->dk + key0 * d, *dvj = J->dvv + key0 * dv;
    for (int64_t r0 = 0; r0 < J->nqp; r0 += rows) {
      const int64_t R = J->nqp - r0 < rows ? J->nqp - r0 : rows;
      chain_float(J->isa, q + r0 * d, d, 1, ktj, bn, s, bn, R, bn, d);
      chain_float(J->isa, dout + r0 * dv, dv, 1, vtj, bn, dp, bn, R, bn, dv);
      bwd_rows(J, b, j, r0, R, s, pc, dp, dsc, base2, pcast, dscast);
      const float *pcu = pcast ? pc : s, *dscu = dscast ? dsc : dp;
      for (int64_t i = 0; i < R / bm; ++i) {
        const int first = r0 + i * bm == 0;
        bwd_tile(J, first, bn, dv, bm, pcu + i * bm * bn, dout + (r0 + i * bm) * dv, dvj, tmp);
        bwd_tile(J, first, bn, d, bm, dscu + i * bm * bn, q + (r0 + i * bm) * d, dkj, tmp);
      }
      chain_float(J->isa, dscu, bn, 1, kj, d, tq, d, R, d, bn);
      float *dqr = dq + r0 * d;
#pragma omp simd
      for (int64_t e = 0; e < R * d; ++e) dqr[e] = dqr[e] + tq[e];
    }
  }
}

/* x86-64-v4: AVX-512 with F16C, so that the fp16 casts are instructions, not calls */
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void fn_fused_backward(const bwd_job *J, int nthreads) {
  const int64_t rows = J->g * J->bm, wide = J->d > J->dv ? J->d : J->dv;
  const int64_t floats = 4 * rows * J->bn + rows * J->d + J->bn * wide;
  nthreads = nthreads < J->B ? nthreads : (int) J->B;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
    float *buf = aligned_alloc(64, (floats * 4 + 63) / 64 * 64);
    float *s = buf, *pc = s + rows * J->bn, *dp = pc + rows * J->bn;
    float *dsc = dp + rows * J->bn, *tq = dsc + rows * J->bn, *tmp = tq + rows * J->d;
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < J->B; ++b) {
      /* each loop compiled for its constants: exp or exp2, and the two casts */
      const int key = (J->base2 * 3 + J->p_cast) * 3 + J->ds_cast;
      switch (key) {
#define BWD_CASE(K, B2, PC, DC) \
  case K: bwd_head(J, b, s, pc, dp, dsc, tq, tmp, B2, PC, DC); break;
        BWD_CASE(0, 0, 0, 0) BWD_CASE(1, 0, 0, 1) BWD_CASE(2, 0, 0, 2)
        BWD_CASE(3, 0, 1, 0) BWD_CASE(4, 0, 1, 1) BWD_CASE(5, 0, 1, 2)
        BWD_CASE(6, 0, 2, 0) BWD_CASE(7, 0, 2, 1) BWD_CASE(8, 0, 2, 2)
        BWD_CASE(9, 1, 0, 0) BWD_CASE(10, 1, 0, 1) BWD_CASE(11, 1, 0, 2)
        BWD_CASE(12, 1, 1, 0) BWD_CASE(13, 1, 1, 1) BWD_CASE(14, 1, 1, 2)
        BWD_CASE(15, 1, 2, 0) BWD_CASE(16, 1, 2, 1) default: BWD_CASE(17, 1, 2, 2)
#undef BWD_CASE
      }
    }
    free(buf);
  }
}
