/* The lossy policies' human-readable lines (docs/design.md, engine: result and exit codes; docs/policies.md "Counters and lines").
 *
 * Pure formatting: no I/O. The engine prints the results to stderr and may also put the warning into
 * the result's `warnings` array. All text is ASCII and locale-independent.
 *
 * Number formats:
 *   counts    unsigned decimal
 *   <pct>     share with one decimal, rounded half up, from the integers (exact): 0/0 prints 0.0
 *   <F>, <L>  config_fmt_real(): the shortest %g text that reads back as the value ("0.75", "1", "1e-06")
 *   warning shares  100·F/k with one decimal, rounded half away from zero from round(1000·F/k) in
 *             double: F=0.75 gives 37.5 (k=2), 18.8 (k=4), 9.4 (k=8)
 *
 * Lines (exact shapes):
 *   moe-drop: <dropped>/<routed> routed experts dropped (<pct>%), threshold <F> x uniform
 *   moe-subst: <changed>/<examined> slots substituted (<pct>%), margin <L> x range
 *   bmoe: WARNING drop-cold-experts=<F> with top-k <k>: a cold expert weighted below <F/k>% of the
 *     routing is dropped here, against <F/8>% at top-k 8, the width this policy's evidence was
 *     measured at; at this width it removes a much larger share of each routing, which nothing has
 *     measured, so verify output quality on your workload
 *   (the warning is one line; it is wrapped here only for reading) */
#ifndef BMOE_POLICY_REPORT_H
#define BMOE_POLICY_REPORT_H

#include <stddef.h>
#include <stdint.h>

#define REPORT_EVIDENCE_TOPK 8   /* the routing width the dropping evidence was measured at */
#define REPORT_NARROW_TOPK   4   /* warn when the effective top-k is this or less */

/* Share of part in whole in tenths of a percent, rounded half up (0 when whole is 0). */
uint64_t report_pct_tenths(uint64_t part, uint64_t whole);

/* 100·F/k in tenths of a percent, rounded half away from zero; -1 for a non-finite F or k < 1. */
long report_share_tenths(double F, int k);

/* The moe-drop / moe-subst line (no trailing newline) into buf. Return snprintf's count: the line is
 * complete when it is < n. */
int report_drop_line(char *buf, size_t n, uint64_t dropped, uint64_t routed, double F);
int report_subst_line(char *buf, size_t n, uint64_t changed, uint64_t examined, double L);

/* Whether the narrow-routing warning is due: dropping armed and 1 <= effective top-k <= 4 and F finite.
 * When it is, formats it (no trailing newline) into buf and returns 1; otherwise writes "" (if n > 0)
 * and returns 0. Print it once, at load. */
int report_narrow_warning(char *buf, size_t n, int drop_armed, double F, int k_effective);

#endif
