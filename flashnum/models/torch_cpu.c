/* The row softmax step of ATen's CPU flash attention (flashnum/engine/torch_cpu.py).

   For each row of a scaled, masked logit block s (rows x n, fp32): the new running max,
   P = exp(s - m) (exp_u20 or fexp_u20 on whole 16-lane vectors, double exp on the tail), its
   row sum in the kernel's order (lane accumulators, the AVX-512 shuffle tree, then the
   tail in order), alpha = expf(m_old - m_new) and l = fma(alpha, l_old, rowsum).
   C, every operation the one IEEE operation the kernel performs: compiled with
   -ffp-contract=off so that only the written fmaf calls fuse, and -fno-math-errno
   -fno-trapping-math so that the exp loops vectorise (no value changes). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16

static float bits_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static float exp_u20(float x) {
    const float ln_min = bits_f(0xc2aeac50u), ln_max = bits_f(0x42b17218u);
    const float log2e = bits_f(0x3fb8aa3bu), ln2 = bits_f(0x3f317218u);
    int below = x < ln_min;
    float src = x < ln_max ? x : ln_max;      /* _mm512_min_ps(x, max) */
    src = src > ln_min ? src : ln_min;        /* _mm512_max_ps(src, min) */
    float fx = floorf(fmaf(src, log2e, 0.5f));
    float r = fmaf(-fx, ln2, src);
    float res = fmaf(r, 0.00828929059f, 0.0418978221f);
    res = fmaf(r, res, 0.166676521f);
    res = fmaf(r, res, 0.499991506f);
    res = fmaf(r, res, 0.999999701f);
    res = fmaf(r, res, 1.0f);
    int32_t e = (int32_t)(fx - 1.0f) + 127;
    /* 2^(fx - 1), 0 where the exponent underflows or x is below ln_min (branch-free, so
       that the 16-lane loops vectorise) */
    float two = bits_f((uint32_t)(e > 0 ? e : 0) << 23);
    two = below ? 0.0f : two;
    return (res * two) * 2.0f;
}

static float fexp_u20(float x) {
    const float ln_min = bits_f(0xc2aeac50u), ln_max = bits_f(0x42b17218u);
    const float log2e = bits_f(0x3fb8aa3bu);
    float src = x * log2e;
    float frac = src - floorf(src);
    float res = fmaf(frac, (float)-0.079204240219773236, (float)-0.22433836478672356);
    res = fmaf(frac, res, (float)0.30354260500649682);
    res = fmaf(frac, res, (float)0.00010703434948458272);
    src = src - res;
    float tmp = fmaf(8388608.0f, src, 1065353216.0f);
    /* cvttps: truncation; NaN and values below the range give INT32_MIN (the second
       select sends NaN there); above the range tmp cannot come for x <= ln_max (< 2.15e9) */
    tmp = tmp > 2147483520.0f ? 2147483520.0f : tmp;
    tmp = tmp >= -2147483648.0f ? tmp : -2147483648.0f;
    int32_t i = (int32_t)tmp;
    i = x < ln_min ? 0 : i;
    i = x > ln_max ? 0x7f800000 : i;
    return bits_f((uint32_t)i);
}

/* s: rows x n scaled logits (-inf where masked); m, l: rows, updated in place;
   p: rows x n, the exponentials; alpha: rows, the rescale of o (1 where the row is
   skipped); live: rows, 0 where the row has seen no visible key yet (P = 0, state kept). */
void tc_softmax_block(const float *s, int64_t rows, int64_t n, float *m, float *l,
                      float *p, float *alpha, int32_t *live, int fast_exp) {
    int64_t main_n = LANES * (n / LANES);
    for (int64_t r = 0; r < rows; r++) {
        const float *sr = s + r * n;
        float *pr = p + r * n;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) mx = sr[j] > mx ? sr[j] : mx;
        float m_new = m[r] > mx ? m[r] : mx;
        if (m_new == -INFINITY) {
            memset(pr, 0, n * sizeof(float));
            alpha[r] = 1.0f;
            live[r] = 0;
            continue;
        }
        /* fast_exp (bf16/fp16 P): two vector accumulators over 32-column steps (lanes
           0-15 and 16-31 of each step), one more for a last 16-column step, folded into
           the first; then the first plus the second; fp32 P: one accumulator */
        int64_t step = fast_exp ? 2 * LANES : LANES;
        int64_t end_n = step * (n / step);
        float acc[2][LANES] = {{0}}, tail[LANES] = {0};
        /* P on the whole vectors first (one elementwise pass: it vectorises; p may be s),
           then the lane sums in the kernel's order */
        if (fast_exp)
            for (int64_t j = 0; j < main_n; j++) pr[j] = fexp_u20(sr[j] - m_new);
        else
            for (int64_t j = 0; j < main_n; j++) pr[j] = exp_u20(sr[j] - m_new);
        for (int64_t c0 = 0; c0 < main_n; c0 += LANES) {
            float *a = c0 >= end_n ? tail : acc[(c0 % step) / LANES];
            for (int i = 0; i < LANES; i++) a[i] += pr[c0 + i];
        }
        for (int i = 0; i < LANES; i++) {
            acc[0][i] = acc[0][i] + tail[i];
            if (fast_exp) acc[0][i] = acc[0][i] + acc[1][i];
        }
        for (int half = LANES / 2; half >= 1; half /= 2)
            for (int i = 0; i < half; i++) acc[0][i] = acc[0][i] + acc[0][i + half];
        float sum = acc[0][0];
        for (int64_t j = main_n; j < n; j++) {
            /* the kernel's tail exp(float) gives the correctly rounded value (measured;
               glibc's expf does not): the double exp rounded once to float */
            float e = (float)exp((double)(sr[j] - m_new));
            sum += e;
            pr[j] = e;
        }
        float a = expf(m[r] - m_new);
        l[r] = fmaf(a, l[r], sum);
        m[r] = m_new;
        alpha[r] = a;
        live[r] = 1;
    }
}

/* ---------------------------------------------------------------------------------------
   The kernel's whole loop (cpu_flash_attention): every (batch * head, query block) task,
   each key block in turn: S = Q K^T by the library GEMM into the thread's buffer, the
   causal -inf fill of the diagonal block, S *= scale, the row softmax above, o *= alpha,
   P stored in the dtype (round to nearest even), o += P V by the library GEMM. Tasks are
   split over threads as at::parallel_for does (contiguous chunks), each thread with its
   own buffers at the offsets the Python model uses (MKL may sum differently for
   differently aligned operands). The output division is left to the caller. */
#include <pthread.h>
#include <stdlib.h>

typedef void (*gemm_fn)(const char *, const char *, const int *, const int *, const int *,
                        const float *, const void *, const int *, const void *, const int *,
                        const float *, float *, const int *);

typedef void (*threads_fn)(int);

typedef struct {
    gemm_fn gemm;
    threads_fn set_threads;  /* omp_set_num_threads of the OpenMP runtime MKL uses */
    const char *q, *k, *v;   /* (bh, n, d) in the dtype */
    int64_t nq, nk, d, qs, ks, esize, tasks, chunk, per_thread;
    int prec;                /* 0 fp32, 1 bf16, 2 fp16 */
    int causal;
    float scale;
    float *f32;              /* threads x per_thread: qk | 2 qs | dst */
    char *low;               /* threads x qs * ks in the dtype (bf16/fp16) */
    float *o_all, *m_all, *l_all;
    int thread;
} tc_job;

static uint16_t to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if (x != x) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);  /* c10::BFloat16's round to nearest even */
    return (uint16_t)(u >> 16);
}

static void gemm(const tc_job *j, const char *ta, const char *tb, int m, int n, int k,
                 const void *a, int lda, const void *b, int ldb, float beta, float *c, int ldc) {
    const float one = 1.0f;
    j->gemm(ta, tb, &m, &n, &k, &one, a, &lda, b, &ldb, &beta, c, &ldc);
}

static void *tc_thread(void *arg) {
    const tc_job *j = (const tc_job *)arg;
    /* a new thread starts from OpenMP's default team size: MKL would split each GEMM over
       the cores (and sum in another order); inside the kernel's parallel loop it runs on one */
    if (j->set_threads) j->set_threads(1);
    int64_t t = j->thread, d = j->d, qs = j->qs, ks = j->ks, es = j->esize;
    int64_t nqb = (j->nq + qs - 1) / qs;
    float *s = j->f32 + t * j->per_thread;
    float *o = s + qs * ks + 2 * qs;
    char *low = j->low ? j->low + t * qs * ks * es : NULL;
    float *alpha = malloc(qs * sizeof(float));
    int32_t *live = malloc(qs * sizeof(int32_t));
    int64_t t1 = (t + 1) * j->chunk < j->tasks ? (t + 1) * j->chunk : j->tasks;
    for (int64_t task = t * j->chunk; task < t1; task++) {
        int64_t h = task / nqb, r0 = (task % nqb) * qs;
        int64_t qb = qs < j->nq - r0 ? qs : j->nq - r0;
        const char *q = j->q + (h * j->nq + r0) * d * es;
        const char *kh = j->k + h * j->nk * d * es, *vh = j->v + h * j->nk * d * es;
        float *m = j->m_all + h * j->nq + r0, *l = j->l_all + h * j->nq + r0;
        for (int64_t r = 0; r < qb; r++) { m[r] = -INFINITY; l[r] = 0.0f; }
        int64_t num_keys = j->causal ? (r0 + qb < j->nk ? r0 + qb : j->nk) : j->nk;
        for (int64_t n = 0; n < num_keys; n += ks) {
            int64_t kvb = ks < j->nk - n ? ks : j->nk - n;
            gemm(j, "T", "N", kvb, qb, d, kh + n * d * es, d, q, d, 0.0f, s, kvb);
            if (j->causal && num_keys - n <= ks)
                for (int64_t r = 0; r < qb; r++)
                    for (int64_t c = 0; c < kvb; c++)
                        if (c > r0 + r - n) s[r * kvb + c] = -INFINITY;
            for (int64_t i = 0; i < qb * kvb; i++) s[i] = s[i] * j->scale;
            /* P overwrites S: each row's max is taken before any of its P is written */
            tc_softmax_block(s, qb, kvb, m, l, s, alpha, live, j->prec != 0);
            if (n > 0)
                for (int64_t r = 0; r < qb; r++)
                    for (int64_t c = 0; c < d; c++) o[r * d + c] = o[r * d + c] * alpha[r];
            const void *pc = s;
            if (j->prec == 1) {
                uint16_t *pl = (uint16_t *)low;
                for (int64_t i = 0; i < qb * kvb; i++) pl[i] = to_bf16(s[i]);
                pc = low;
            } else if (j->prec == 2) {
                _Float16 *pl = (_Float16 *)low;
                for (int64_t i = 0; i < qb * kvb; i++) pl[i] = (_Float16)s[i];
                pc = low;
            }
            gemm(j, "N", "N", d, qb, kvb, vh + n * d * es, d, pc, kvb, n == 0 ? 0.0f : 1.0f,
                 o, d);
        }
        memcpy(j->o_all + (h * j->nq + r0) * d, o, qb * d * sizeof(float));
    }
    free(alpha);
    free(live);
    return NULL;
}

/* Runs every task on `threads` threads. */
void tc_attention(void *gemm_ptr, void *set_threads, const void *q, const void *k, const void *v, int64_t bh,
                  int64_t nq, int64_t nk, int64_t d, int64_t qs, int64_t ks, int prec,
                  int causal, float scale, float *f32, void *low, int64_t threads,
                  int64_t per_thread, float *o_all, float *m_all, float *l_all) {
    int64_t tasks = bh * ((nq + qs - 1) / qs);
    int64_t chunk = (tasks + threads - 1) / threads;
    tc_job *jobs = malloc(threads * sizeof(tc_job));
    pthread_t *ids = malloc(threads * sizeof(pthread_t));
    for (int64_t t = 0; t < threads; t++) {
        tc_job job = {(gemm_fn)gemm_ptr, (threads_fn)set_threads, q, k, v, nq, nk, d, qs, ks, prec == 0 ? 4 : 2,
                      tasks, chunk, per_thread, prec, causal, scale, f32, low, o_all,
                      m_all, l_all, (int)t};
        jobs[t] = job;
    }
    /* every task on threads of our own, each set to one OpenMP thread: the caller's
       OpenMP team size stays as it is (changing it costs torch a new team) */
    for (int64_t t = 0; t < threads; t++) pthread_create(&ids[t], NULL, tc_thread, &jobs[t]);
    for (int64_t t = 0; t < threads; t++) pthread_join(ids[t], NULL);
    free(jobs);
    free(ids);
}

/* lse = m + logf(l) (std::log of a float: the C library's logf), n rows. */
void tc_lse(const float *m, const float *l, float *lse, int64_t n) {
    for (int64_t i = 0; i < n; i++) lse[i] = m[i] + logf(l[i]);
}

/* The kernel's epilogue for `rows` rows of o (rows x d, fp32) and their m, l: out =
   o * fl32(1 / l) rounded to the dtype (a row with l = 0 takes l = 1), written as double;
   m (-inf: 0), l and lse = m + logf(l) as double; nonfinite: a row with inf or NaN. */
void tc_finish(const float *o, const float *m, const float *l, int64_t rows, int64_t d,
               int prec, double *out, double *m64, double *l64, double *lse64,
               uint8_t *nonfinite) {
    for (int64_t r = 0; r < rows; r++) {
        float ls = l[r] == 0.0f ? 1.0f : l[r];
        float recip = 1.0f / ls;
        uint8_t bad = 0;
        for (int64_t c = 0; c < d; c++) {
            float x = o[r * d + c] * recip;
            if (prec == 1) {
                uint32_t u = (uint32_t)to_bf16(x) << 16;
                memcpy(&x, &u, 4);
            } else if (prec == 2) {
                x = (float)(_Float16)x;
            }
            bad |= !isfinite(x);
            out[r * d + c] = (double)x;
        }
        float m0 = m[r] == -INFINITY ? 0.0f : m[r];
        m64[r] = (double)m0;
        l64[r] = (double)ls;
        lse64[r] = (double)(m0 + logf(ls));
        nonfinite[r] = bad;
    }
}

/* ---------------------------------------------------------------------------------------
   The backward's exp (flashnum/engine/torch_cpu_backward.py). cpu_flash_attention_backward
   restores P with vec::map and Vectorized<float>::exp(), which on the AVX-512 build is
   SLEEF's Sleef_expf16_u10 on every column (vec::map loads a partial last vector, so no
   scalar tail): q = rint(d / ln 2); s = d - q ln2 in two fmas (ln 2 split in L2U + L2L);
   a degree-5 polynomial by fma; u = 1 + fma(s * s, u, s); u * 2^(q >> 1) * 2^(q - (q >> 1));
   0 below -104, inf above 100. */
static float sleef_expf_u10(float d) {
    const float r_ln2 = 1.442695040888963407359924681001892137426645954152985934135449406931f;
    const float l2u = 0.693145751953125f, l2l = 1.428606765330187045e-06f;
    /* outside [-104, 100] the result is fixed below; the clamp only keeps the conversion
       to int defined (NaN: any value, NaN is returned) */
    float dc = d < -110.0f ? -110.0f : (d > 110.0f ? 110.0f : d);
    dc = d == d ? dc : 0.0f;
    int32_t q = (int32_t)rintf(dc * r_ln2);  /* cvtps2dq: nearest, ties to even */
    float qf = (float)q;
    float s = fmaf(qf, -l2u, dc);
    s = fmaf(qf, -l2l, s);
    float u = 0.000198527617612853646278381f;
    u = fmaf(u, s, 0.00139304355252534151077271f);
    u = fmaf(u, s, 0.00833336077630519866943359f);
    u = fmaf(u, s, 0.0416664853692054748535156f);
    u = fmaf(u, s, 0.166666671633720397949219f);
    u = fmaf(u, s, 0.5f);
    u = 1.0f + fmaf(s * s, u, s);
    int32_t h = q >> 1;  /* arithmetic shift, as vsra */
    u = (u * bits_f((uint32_t)(h + 127) << 23)) * bits_f((uint32_t)(q - h + 127) << 23);
    u = d < -104.0f ? 0.0f : u;
    u = 100.0f < d ? INFINITY : u;
    return d == d ? u : d;
}

/* a (rows x n, fp32) <- exp(a - lse[row]) in place. */
void tc_exp_rows(float *a, int64_t rows, int64_t n, const float *lse) {
    for (int64_t r = 0; r < rows; r++) {
        float *ar = a + r * n;
        const float x = lse[r];
        for (int64_t j = 0; j < n; j++) ar[j] = sleef_expf_u10(ar[j] - x);
    }
}
