/* Minimal test harness for the engine's C unit tests: CHECK records a failure and continues;
 * main returns check_report(), non-zero when anything failed. */
#ifndef BMOE_CHECK_H
#define BMOE_CHECK_H
#include <stdio.h>

static int check_failures;
static int check_count;

#define CHECK(cond) do { check_count++; if (!(cond)) { check_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)

static inline int check_report(const char *name) {
    printf("%s: %d checks, %d failed\n", name, check_count, check_failures);
    return check_failures ? 1 : 0;
}
#endif
