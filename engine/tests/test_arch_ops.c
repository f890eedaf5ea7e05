/* Unit tests of the recipe-specific pieces of the forward pass (arch_ops.c): bias rows, the row scale,
 * gpt-oss's clamped SwiGLU (its clamps, NaN kept as ggml keeps it), the sigmoid, and YaRN's per-dimension
 * mix and magnitude on gpt-oss-20b's real parameters (llama.cpp's correction range 8..18 there). Built
 * and run under AddressSanitizer + UBSan by `make -C engine test`. */
#include "arch_ops.h"
#include "check.h"

#include <math.h>

static int near(double a, double b, double tol) { return fabs(a - b) <= tol * (fabs(b) > 1 ? fabs(b) : 1); }

static void test_bias_and_scale(void) {
    float y[6] = { 1, 2, 3, 4, 5, 6 };
    const float b[3] = { 0.5f, -1, 0 };
    ops_add_bias_rows(y, b, 2, 3);
    CHECK(y[0] == 1.5f && y[1] == 1 && y[2] == 3 && y[3] == 4.5f && y[4] == 4 && y[5] == 6);
    ops_add_bias_rows(y, NULL, 2, 3); /* no bias: nothing */
    CHECK(y[0] == 1.5f);
    ops_scale_rows(y, 2.0f, 2, 3);
    CHECK(y[0] == 3.0f && y[5] == 12.0f);
}

static void test_swiglu_oai(void) {
    const float g[5] = { 0.0f, 1.0f, 9.0f, -3.0f, NAN };
    const float u[5] = { 1.0f, -9.0f, 9.0f, 0.5f, 0.0f };
    float out[5];
    ops_swiglu_oai(g, u, 5, out);
    CHECK(out[0] == 0.0f);                                                  /* g = 0 */
    CHECK(near(out[1], 1.0 / (1.0 + exp(-1.702)) * (-7.0 + 1.0), 1e-6));    /* up clamped to -7 */
    CHECK(near(out[2], 7.0 / (1.0 + exp(-1.702 * 7.0)) * (7.0 + 1.0), 1e-6)); /* gate and up clamped to 7 */
    CHECK(near(out[3], -3.0 / (1.0 + exp(1.702 * 3.0)) * 1.5, 1e-6));        /* no lower clamp on the gate */
    CHECK(isnan(out[4]));                                                   /* min(NaN, 7) stays NaN */
    float same[2] = { 2.0f, 3.0f }; /* out may be u */
    const float g2[2] = { 1.0f, 1.0f };
    ops_swiglu_oai(g2, same, 2, same);
    CHECK(near(same[0], 1.0 / (1.0 + exp(-1.702)) * 3.0, 1e-6) && near(same[1], 1.0 / (1.0 + exp(-1.702)) * 4.0, 1e-6));
}

static void test_sigmoid(void) {
    CHECK(ops_sigmoid(0.0f) == 0.5f);
    CHECK(near(ops_sigmoid(2.0f), 1.0 / (1.0 + exp(-2.0)), 1e-7));
    CHECK(ops_sigmoid(-100.0f) < 1e-40f && ops_sigmoid(100.0f) == 1.0f);
}

static void test_yarn(void) {
    /* gpt-oss-20b: 64 rotated dims, base 150000, factor 32 over 4096 positions: llama.cpp's correction
     * range is dims 8..18; below it a pair keeps its angle, above it the angle is scaled by 1/32 */
    double inv[32];
    for (int j = 0; j < 32; j++) inv[j] = 1.0;
    double m = ops_yarn(64, 150000.0, 1.0 / 32.0, 4096, 32.0, 1.0, 1.0, inv);
    CHECK(near(m, 1.0 + 0.1 * log(32.0), 1e-12));
    CHECK(inv[0] == 1.0 && inv[8] == 1.0);                      /* ramp 1: unscaled */
    CHECK(near(inv[13], 1.0 / 32.0 * 0.5 + 0.5, 1e-12));        /* halfway: (13 - 8) / (18 - 8) */
    CHECK(near(inv[18], 1.0 / 32.0, 1e-12) && near(inv[31], 1.0 / 32.0, 1e-12)); /* ramp 0: scaled */
    /* the attention factor multiplies the magnitude; scale 1 leaves every angle alone */
    for (int j = 0; j < 32; j++) inv[j] = 2.0;
    m = ops_yarn(64, 150000.0, 1.0, 4096, 32.0, 1.0, 1.5, inv);
    CHECK(m == 1.5 && inv[0] == 2.0 && inv[31] == 2.0);
}

int main(void) {
    test_bias_and_scale();
    test_swiglu_oai();
    test_sigmoid();
    test_yarn();
    return check_report("test_arch_ops");
}
