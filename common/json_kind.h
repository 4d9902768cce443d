/* The kind of a JSON value in the words of an error message ("expected an object, got an
 * array"), one table for every parser of JSON input: the policy config and replay traces
 * (service/policy), `prismctl plan`'s PLAN.json and prism-agent's --profile-file. */
#ifndef PRISM_JSON_KIND_H
#define PRISM_JSON_KIND_H

#include <jansson.h>

/* "an object", "an array", "a string", "a number" (an integer or a real), "a boolean" or "null";
 * never NULL. A caller whose messages tell integers from reals tests json_is_integer first. */
const char *prism_json_kind(const json_t *v);

#endif
