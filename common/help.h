/* The --help text of Prism's daemons (prismd, prism-agent): one entry per option or endpoint,
 * its label in a column and its text wrapped beside it. */
#ifndef PRISM_HELP_H
#define PRISM_HELP_H

#include <stdio.h>

#define PRISM_HELP_COLUMN 31 /* where the text starts */
#define PRISM_HELP_WIDTH 100 /* where lines are wrapped */

/* Prints "  LABEL  text..." with the text wrapped at PRISM_HELP_WIDTH and indented to
 * PRISM_HELP_COLUMN (a label too wide for its column gets a line of its own), then tail (may be
 * NULL, e.g. "(default: 8080)") kept whole on the last line or the next. */
void prism_help_entry(FILE *out, const char *label, const char *text, const char *tail);

#endif
