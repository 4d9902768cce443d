/* --help text of Prism's daemons (help.h). */
#include "help.h"

#include <stdbool.h>
#include <string.h>

void prism_help_entry(FILE *out, const char *label, const char *text, const char *tail)
{
    int used = fprintf(out, "  %-*s ", PRISM_HELP_COLUMN - 3, label);
    if (used > PRISM_HELP_COLUMN) {
        fprintf(out, "\n%*s", PRISM_HELP_COLUMN, "");
        used = PRISM_HELP_COLUMN;
    }
    int col = used;
    bool line_start = true;
    while (*text) {
        while (*text == ' ')
            text++;
        int word = (int)strcspn(text, " ");
        if (word == 0)
            break;
        if (!line_start && col + 1 + word > PRISM_HELP_WIDTH) {
            fprintf(out, "\n%*s", PRISM_HELP_COLUMN, "");
            col = PRISM_HELP_COLUMN;
            line_start = true;
        }
        if (!line_start) {
            fputc(' ', out);
            col++;
        }
        fprintf(out, "%.*s", word, text);
        col += word;
        text += word;
        line_start = false;
    }
    if (tail) {
        int len = (int)strlen(tail);
        if (!line_start && col + 1 + len > PRISM_HELP_WIDTH)
            fprintf(out, "\n%*s%s", PRISM_HELP_COLUMN, "", tail);
        else
            fprintf(out, "%s%s", line_start ? "" : " ", tail);
    }
    fputc('\n', out);
}
