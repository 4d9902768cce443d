/* Fuzz target "config": the policy config loader (service/policy/config.c), JSON text to a
 * prism_config, in both the bare and the nested training-config form. A config that loads must
 * also print (prism_config_to_json, prism_json_dumps_exact) and load back to the same JSON. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    prism_config cfg;
    prism_error err;
    if (prism_config_load_buffer((const char *)data, size, "fuzz", &cfg, &err) != PRISM_OK) {
        FUZZ_CHECK(err.message[0] != '\0');
        return 0;
    }
    FUZZ_CHECK(prism_config_validate(&cfg, &err) == PRISM_OK);
    json_t *obj = prism_config_to_json(&cfg);
    FUZZ_CHECK(obj != NULL);
    char *text = prism_json_dumps_exact(obj, JSON_COMPACT);
    FUZZ_CHECK(text != NULL);
    prism_config again;
    if (prism_config_load_buffer(text, strlen(text), "fuzz-again", &again, &err) != PRISM_OK) {
        fprintf(stderr, "config printed as %s does not load back: %s\n", text, err.message);
        abort();
    }
    json_t *obj2 = prism_config_to_json(&again);
    FUZZ_CHECK(obj2 != NULL && json_equal(obj, obj2));
    json_decref(obj2);
    prism_config_free(&again);
    free(text);
    json_decref(obj);
    prism_config_free(&cfg);
    return 0;
}
