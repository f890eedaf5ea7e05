/* Numeric kernels: f16 conversion edge cases, dot products against naive references (and against
 * the documented reduction order, bit for bit), dequantisation, the portable math functions. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "gguf.h"
#include "kernels.h"
#include "tensor.h"

static uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* deterministic, in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void test_f16(void) {
    CHECK(bits_of(bm_f16_to_f32(0x0000)) == 0x00000000u);
    CHECK(bits_of(bm_f16_to_f32(0x8000)) == 0x80000000u);              /* -0 */
    CHECK(bm_f16_to_f32(0x3c00) == 1.0f);
    CHECK(bm_f16_to_f32(0xc000) == -2.0f);
    CHECK(bm_f16_to_f32(0x7bff) == 65504.0f);                          /* largest finite */
    CHECK(bm_f16_to_f32(0x0001) == ldexpf(1.0f, -24));                 /* smallest subnormal */
    CHECK(bm_f16_to_f32(0x03ff) == ldexpf(1023.0f, -24));              /* largest subnormal */
    CHECK(bm_f16_to_f32(0x0400) == ldexpf(1.0f, -14));                 /* smallest normal */
    CHECK(isinf(bm_f16_to_f32(0x7c00)) && bm_f16_to_f32(0x7c00) > 0);
    CHECK(isinf(bm_f16_to_f32(0xfc00)) && bm_f16_to_f32(0xfc00) < 0);
    CHECK(isnan(bm_f16_to_f32(0x7e00)));
    CHECK(isnan(bm_f16_to_f32(0x7c01)));                               /* signalling NaN stays NaN */

    /* every half value survives half → float → half (NaNs stay NaNs) */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = bm_f16_to_f32((uint16_t)h);
        uint16_t back = bm_f32_to_f16(f);
        if (isnan(f)) bad += !((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
        else bad += back != h;
    }
    CHECK(bad == 0);

    /* rounding: to nearest, ties to even, overflow to inf, underflow to zero */
    CHECK(bm_f32_to_f16(65519.0f) == 0x7bff);
    CHECK(bm_f32_to_f16(65520.0f) == 0x7c00);
    CHECK(bm_f32_to_f16(-1e10f) == 0xfc00);
    CHECK(bm_f32_to_f16(1.0f + ldexpf(1.0f, -11)) == 0x3c00);          /* tie → even (down) */
    CHECK(bm_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)) == 0x3c02);      /* tie → even (up) */
    CHECK(bm_f32_to_f16(ldexpf(1.0f, -25)) == 0x0000);                 /* half the smallest subnormal */
    CHECK(bm_f32_to_f16(ldexpf(1.5f, -25)) == 0x0001);
    CHECK(bm_f32_to_f16(ldexpf(1.0f, -30)) == 0x0000);
    CHECK(bm_f32_to_f16(-ldexpf(1.0f, -30)) == 0x8000);
    CHECK(bm_f32_to_f16(ldexpf(1023.5f, -24)) == 0x0400);              /* rounds up into the normals */
    CHECK(bm_f32_to_f16(INFINITY) == 0x7c00);
    CHECK((bm_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (bm_f32_to_f16(NAN) & 0x3ff));
}

/* The documented order: lane i mod 8, lanes combined ((0+1)+(2+3))+((4+5)+(6+7)). */
static float lanes_ref(const float *a, const float *b, size_t n) {
    float l[8] = {0};
    for (size_t i = 0; i < n; i++) l[i % 8] += a[i] * b[i];
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }

static void test_dot(void) {
    static const size_t sizes[] = {1, 3, 7, 8, 9, 31, 32, 33, 64, 96, 100, 257};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si];
        float a[257], x[257], ah[257];
        uint8_t h[2 * 257];
        for (size_t i = 0; i < n; i++) { a[i] = frand() * 4; x[i] = frand(); }
        double ref = 0;
        for (size_t i = 0; i < n; i++) ref += (double)a[i] * x[i];
        float got = bm_vdot_f32_scalar(a, x, n);
        CHECK(fabs(got - ref) <= 1e-5 * (1 + fabs(ref)));
        CHECK(bits_of(got) == bits_of(lanes_ref(a, x, n)));
        
        for (size_t i = 0; i < n; i++) { uint16_t v = bm_f32_to_f16(a[i]); put16(h + 2 * i, v); ah[i] = bm_f16_to_f32(v); }
        float g16 = bm_vdot_f16_scalar(h, x, n);
        CHECK(bits_of(g16) == bits_of(lanes_ref(ah, x, n)));
        float deq[257];
        row_to_f32(GGML_TYPE_F16, h, deq, n);
        CHECK(memcmp(deq, ah, n * sizeof(float)) == 0);
    }
    /* Q8_0: blocks of an f16 scale and 32 int8 */
    for (size_t nb = 1; nb <= 4; nb++) {
        size_t n = nb * 32;
        uint8_t q[4 * 34];
        float x[128], deq[128];
        double ref = 0;
        for (size_t b = 0; b < nb; b++) {
            uint16_t s = bm_f32_to_f16(0.01f * (float)(b + 1));
            put16(q + 34 * b, s);
            for (int i = 0; i < 32; i++) q[34 * b + 2 + i] = (uint8_t)(int8_t)((int)(frand() * 127));
        }
        for (size_t i = 0; i < n; i++) x[i] = frand();
        row_to_f32(GGML_TYPE_Q8_0, q, deq, n);
        for (size_t b = 0; b < nb; b++) {
            float sc = bm_f16_to_f32((uint16_t)(q[34 * b] | q[34 * b + 1] << 8));
            for (int i = 0; i < 32; i++) {
                float v = sc * (float)(int8_t)q[34 * b + 2 + i];
                CHECK(deq[32 * b + (size_t)i] == v);
                ref += (double)v * x[32 * b + (size_t)i];
            }
        }
        (void)ref; /* the Q8_0 dot products are tested in test_kernels.c */
    }
}

static void test_math(void) {
    double worst = 0;
    for (double x = -700; x <= 700; x += 0.37) {
        double r = fabs(bm_exp(x) - exp(x)) / exp(x);
        if (r > worst) worst = r;
    }
    CHECK(worst < 4e-16);
    CHECK(bm_exp(0) == 1.0);
    CHECK(bm_exp(1000) == HUGE_VAL);
    CHECK(bm_exp(-1000) == 0.0);
    CHECK(isnan(bm_exp(NAN)));
    CHECK(bm_exp(-740) > 0 && fabs(bm_exp(-740) - exp(-740)) / exp(-740) < 1e-3); /* subnormal result */
    worst = 0;
    for (double x = 1e-300; x < 1e300; x *= 7.3) {
        double r = fabs(bm_log(x) - log(x)) / fabs(log(x) ? log(x) : 1);
        if (r > worst) worst = r;
    }
    CHECK(worst < 4e-16);
    CHECK(bm_log(1.0) == 0.0);
    CHECK(fabs(bm_log(10000.0) - log(10000.0)) < 1e-14);
    worst = 0;
    for (double x = -5000; x <= 5000; x += 0.731) {
        double s, c;
        bm_sincos(x, &s, &c);
        double e = fmax(fabs(s - sin(x)), fabs(c - cos(x)));
        if (e > worst) worst = e;
    }
    CHECK(worst < 1e-15);
    for (float z = -30; z <= 30; z += 0.25f) {
        double g = 0.5 * z * (1 + tanh(sqrt(2 / M_PI) * (z + 0.044715 * z * z * z)));
        CHECK(fabs(bm_gelu_tanh(z) - g) <= 1e-6 * (1 + fabs(g)));
        double s = z / (1 + exp(-z));
        CHECK(fabs(bm_silu(z) - s) <= 1e-6 * (1 + fabs(s)));
    }
    for (double x = -40; x <= 40; x += 0.37) CHECK(fabs(bm_tanh(x) - tanh(x)) <= 1e-15);
    /* ggml's f16 GELU table: input and output rounded to f16, the tails cut at -10 and 10 */
    for (int i = 0; i < 20000; i++) {
        float z = 12.0f * frand();
        float g = bm_gelu_f16(z);
        if (z <= -10.0f) { CHECK(g == 0.0f); continue; }
        if (z >= 10.0f) { CHECK(g == z); continue; }
        float h = bm_f16_to_f32(bm_f32_to_f16(z));
        CHECK(g == bm_f16_to_f32(bm_f32_to_f16(bm_gelu_tanh(h))));   /* an f16 value: the table's */
        CHECK(fabs(g - bm_gelu_tanh(z)) <= 2e-3 * (fabs(z) + 1e-3)); /* within f16 rounding of gelu */
    }
    CHECK(bm_gelu_f16(1.0001f) == bm_f16_to_f32(bm_f32_to_f16(bm_gelu_tanh(1.0f)))); /* 1.0001 -> f16 1.0 */
    CHECK(bm_gelu_f16(-10.0f) == 0.0f && bm_gelu_f16(-30.0f) == 0.0f);
    CHECK(bm_gelu_f16(10.0f) == 10.0f && bm_gelu_f16(11.5f) == 11.5f);
    CHECK(isnan(bm_gelu_f16(NAN)));
}

/* bm_gelu_f16_tab against bm_gelu_f16, bit for bit: every f16 value, the +-10 edges, NaN and infinities,
 * and floats between f16 values (each rounds to an entry). */
static void test_gelu_table(void) {
    static float tab[BM_GELU_TAB];
    bm_gelu_f16_table(tab);
    uint32_t bad = 0, seed = 12345u;
    for (uint32_t h = 0; h < BM_GELU_TAB; h++) {
        float z = bm_f16_to_f32((uint16_t)h), a = bm_gelu_f16_tab(tab, z), b = bm_gelu_f16(z);
        bad += memcmp(&a, &b, sizeof a) != 0;
    }
    const float edge[] = {-10.0f, 10.0f, nextafterf(-10.0f, 0.0f), nextafterf(10.0f, 0.0f), INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) {
        float a = bm_gelu_f16_tab(tab, edge[i]), b = bm_gelu_f16(edge[i]);
        bad += memcmp(&a, &b, sizeof a) != 0;
    }
    for (int i = 0; i < 100000; i++) {
        seed = seed * 1664525u + 1013904223u;
        float z = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 24.0f, a = bm_gelu_f16_tab(tab, z), b = bm_gelu_f16(z);
        bad += memcmp(&a, &b, sizeof a) != 0;
    }
    CHECK(bad == 0);
}

int main(void) {
    test_f16();
    test_dot();
    test_math();
    test_gelu_table();
    return check_report("test_tensor");
}
