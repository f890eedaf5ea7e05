/* The lossy policies' stderr lines and the narrow-routing warning (policy_report.h). Percentages are
 * formatted from integers ("%llu.%llu"), never with %f, so no locale can change a byte of them. */
#include "policy_report.h"

#include <math.h>
#include <stdio.h>

#include "config.h"

uint64_t report_pct_tenths(uint64_t part, uint64_t whole) {
    if (whole == 0) return 0;
    uint64_t q = part / whole, r = part % whole;
    if (r <= UINT64_MAX / 1000u && q <= UINT64_MAX / 1000u - 1u)
#ifndef BMOE_FAULT_REPORT_PCT_TRUNCATED
        return q * 1000u + (r * 1000u + whole / 2u) / whole;
#else
        return q * 1000u + (r * 1000u) / whole; /* fault: the tenths are truncated, not rounded half up */
#endif
    /* counters beyond 1.8e16: the last digit may be off by one, nothing worse */
    return (uint64_t)floorl((long double)part * 1000.0L / (long double)whole + 0.5L);
}

long report_share_tenths(double F, int k) {
    if (!isfinite(F) || k < 1) return -1;
    double t = round(F * 1000.0 / (double)k);
    if (!(fabs(t) < 1e15)) return -1;
    return (long)t;
}

/* "37.5" from 375 (and "-0.5" from -5, should a caller ever pass a negative F) */
static const char *tenths_text(long t, char *buf, size_t n) {
    unsigned long a = t < 0 ? (unsigned long)(-(t + 1)) + 1u : (unsigned long)t;
    snprintf(buf, n, "%s%lu.%lu", t < 0 ? "-" : "", a / 10u, a % 10u);
    return buf;
}

int report_drop_line(char *buf, size_t n, uint64_t dropped, uint64_t routed, double F) {
    char f[32];
    uint64_t t = report_pct_tenths(dropped, routed);
    return snprintf(buf, n, "moe-drop: %llu/%llu routed experts dropped (%llu.%llu%%), threshold %s x uniform",
                    (unsigned long long)dropped, (unsigned long long)routed, (unsigned long long)(t / 10u),
                    (unsigned long long)(t % 10u), config_fmt_real(F, f, sizeof f));
}

int report_subst_line(char *buf, size_t n, uint64_t changed, uint64_t examined, double L) {
    char l[32];
    uint64_t t = report_pct_tenths(changed, examined);
    return snprintf(buf, n, "moe-subst: %llu/%llu slots substituted (%llu.%llu%%), margin %s x range",
                    (unsigned long long)changed, (unsigned long long)examined, (unsigned long long)(t / 10u),
                    (unsigned long long)(t % 10u), config_fmt_real(L, l, sizeof l));
}

int report_narrow_warning(char *buf, size_t n, int drop_armed, double F, int k_effective) {
    if (buf && n > 0) buf[0] = 0;
    if (!drop_armed || k_effective < 1 || k_effective > REPORT_NARROW_TOPK || !isfinite(F)) return 0;
    if (!buf || n == 0) return 1;
    char f[32], here[32], there[32];
    long t_here = report_share_tenths(F, k_effective);
    long t_there = report_share_tenths(F, REPORT_EVIDENCE_TOPK);
#ifdef BMOE_FAULT_WARN_HARDCODED
    /* fault: the evidence side is the uniform share at top-k 8, whatever F is */
    t_there = 125;
#endif
    snprintf(buf, n,
             "bmoe: WARNING drop-cold-experts=%s with top-k %d: the threshold is %s%% of the routing here, "
             "against %s%% at the top-k %d this was measured on; a miss loses a far larger share of each "
             "routing at this width, which nothing here has measured, so verify output quality on your workload",
             config_fmt_real(F, f, sizeof f), k_effective, tenths_text(t_here, here, sizeof here),
             tenths_text(t_there, there, sizeof there), REPORT_EVIDENCE_TOPK);
    return 1;
}
