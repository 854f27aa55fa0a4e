/* The row softmax step of ATen's CPU flash attention (flashnum/engine/torch_cpu.py).

   For each row of a scaled, masked logit block s (rows x n, fp32): the new running max,
   P = exp(s - m) (exp_u20 or fexp_u20 on whole 16-lane vectors, double exp on the tail), its
   row sum in the kernel's order (lane accumulators, the AVX-512 shuffle tree, then the
   tail in order), alpha = expf(m_old - m_new) and l = fma(alpha, l_old, rowsum).
   Scalar C, every operation the one IEEE operation the kernel performs: compiled with
   -ffp-contract=off so that only the written fmaf calls fuse. */
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
    float two = (below || e <= 0) ? 0.0f : bits_f((uint32_t)e << 23);
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
    /* cvttps: truncation; out of range (and NaN) gives INT32_MIN */
    int32_t i = (tmp >= -2147483648.0f && tmp < 2147483648.0f) ? (int32_t)tmp : INT32_MIN;
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
        for (int64_t c0 = 0; c0 < main_n; c0 += LANES) {
            float *a = c0 >= end_n ? tail : acc[(c0 % step) / LANES];
            if (fast_exp) {
                for (int i = 0; i < LANES; i++) {
                    float e = fexp_u20(sr[c0 + i] - m_new);
                    pr[c0 + i] = e;
                    a[i] += e;
                }
            } else {
                for (int i = 0; i < LANES; i++) {
                    float e = exp_u20(sr[c0 + i] - m_new);
                    pr[c0 + i] = e;
                    a[i] += e;
                }
            }
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
