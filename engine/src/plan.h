/* One line of a batch plan: {"id": "<string>", "argv": ["run"|"check", ...options]}.
 *
 * A minimal, bounded JSON reader for exactly that shape: strings with every JSON escape (\uXXXX and
 * surrogate pairs become UTF-8; \u0000 is refused, argv strings are C strings), other keys skipped
 * whatever their value, nesting and sizes bounded. */
#ifndef BMOE_PLAN_H
#define BMOE_PLAN_H

#include <stddef.h>

#define BMOE_PLAN_MAX_LINE (1u << 20)
#define BMOE_PLAN_MAX_ARGS 4096

typedef struct bmoe_plan_entry {
    char *id;      /* NULL when the line has no readable id */
    int argc;
    char **argv;   /* argv[0] is the subcommand */
} bmoe_plan_entry;

/* Parses line[0..len). Returns 0, or 2 with a one-line message (e->id may still be set so the error
 * can carry it). Always call plan_entry_free. */
int plan_parse_line(const char *line, size_t len, bmoe_plan_entry *e, char *err, size_t errlen);
void plan_entry_free(bmoe_plan_entry *e);

#endif
