/* prism-agent --profile-file (profile.h, prism_profile_read_file): a DeviceProfile from a JSON
 * file instead of the measurement, so that one machine can play another device (a T4 beside an
 * A100 in a test of hybrid plans). The object is the DeviceProfile by its proto field names, the
 * same as PLAN.json's classes[].profile (prismctl plan). */
#include "profile.h"

#include "json_kind.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Every key of obj is one of keys; else PRISM_ERR_INVALID naming the first unknown one (prefix
 * "" at the top level, else "NAME."). */
static prism_status only_keys(const json_t *obj, const char *prefix, const char *const *keys, prism_error *err)
{
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)obj, key, value) {
        (void)value;
        bool known = false;
        for (size_t i = 0; keys[i] && !known; i++)
            known = strcmp(key, keys[i]) == 0;
        if (!known)
            return prism_error_set(err, PRISM_ERR_INVALID, "%s%.100s: unknown key", prefix, key);
    }
    return PRISM_OK;
}

/* obj[key], a finite number >= 0 (missing: 0). */
static prism_status get_figure(const json_t *obj, const char *prefix, const char *key, double *out, prism_error *err)
{
    *out = 0;
    const json_t *v = json_object_get(obj, key);
    if (!v)
        return PRISM_OK;
    if (!json_is_number(v))
        return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: expected a number, got %s", prefix, key, prism_json_kind(v));
    double x = json_number_value(v);
    if (!isfinite(x))
        return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: %g is not finite", prefix, key, x);
    if (x < 0)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: %g is negative", prefix, key, x);
    *out = x;
    return PRISM_OK;
}

/* obj[key], a byte count (missing: 0), exactly: a JSON integer is taken as the integer it is
 * (jansson's long long: any value up to 2^63 - 1; a larger one does not parse), never through a
 * double; a JSON real must be a whole number below 2^53, where a double still holds every
 * integer, so 1e9 reads as 1000000000 and nothing is rounded. Negative: refused. */
static prism_status get_bytes(const json_t *obj, const char *key, uint64_t *out, prism_error *err)
{
    *out = 0;
    const json_t *v = json_object_get(obj, key);
    if (!v)
        return PRISM_OK;
    if (json_is_integer(v)) {
        json_int_t n = json_integer_value(v);
        if (n < 0)
            return prism_error_set(err, PRISM_ERR_INVALID, "%s: %" JSON_INTEGER_FORMAT " is negative", key, n);
        *out = (uint64_t)n;
        return PRISM_OK;
    }
    if (!json_is_real(v))
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: expected a number, got %s", key, prism_json_kind(v));
    double x = json_real_value(v);
    if (!isfinite(x))
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: %g is not finite", key, x);
    if (x < 0)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: %g is negative", key, x);
    if (x != floor(x) || x >= 9007199254740992.0)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "%s: %g is not a whole number of bytes below 2^53 (write a larger count as an integer)",
                               key, x);
    *out = (uint64_t)x;
    return PRISM_OK;
}

/* obj[key], a string shorter than cap bytes, into buf (missing: buf untouched, *given false). */
static prism_status get_text(const json_t *obj, const char *key, char *buf, size_t cap, bool *given,
                             prism_error *err)
{
    *given = false;
    const json_t *v = json_object_get(obj, key);
    if (!v)
        return PRISM_OK;
    if (!json_is_string(v))
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: expected a string, got %s", key, prism_json_kind(v));
    size_t len = json_string_length(v);
    if (len >= cap)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: %zu bytes, at most %zu", key, len, cap - 1);
    memcpy(buf, json_string_value(v), len);
    buf[len] = '\0';
    *given = true;
    return PRISM_OK;
}

static prism_status get_cost(const json_t *obj, const char *key, prism_linear_cost *out, prism_error *err)
{
    memset(out, 0, sizeof *out);
    const json_t *v = json_object_get(obj, key);
    if (!v)
        return PRISM_OK;
    if (!json_is_object(v))
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: expected an object, got %s", key, prism_json_kind(v));
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%s.", key);
    static const char *const keys[] = {"fixed_seconds", "seconds_per_byte", NULL};
    prism_status s = only_keys(v, prefix, keys, err);
    if (!s)
        s = get_figure(v, prefix, "fixed_seconds", &out->fixed_seconds, err);
    if (!s)
        s = get_figure(v, prefix, "seconds_per_byte", &out->seconds_per_byte, err);
    return s;
}

/* Whether s is a device class --device-class would accept: 1 to 63 letters, digits, '-', '_',
 * '.'. */
static bool class_ok(const char *s)
{
    size_t n = strlen(s);
    return n > 0 && n < PRISM_PROFILE_CLASS_MAX &&
           strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") == n;
}

prism_status prism_profile_read_file(const char *path, const char *device_class, prism_device_profile *out,
                                     prism_error *err)
{
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        if (je.line < 0)
            return prism_error_set(err, PRISM_ERR_INVALID, "%s", je.text);
        return prism_error_set(err, PRISM_ERR_INVALID, "line %d column %d: %s", je.line, je.column, je.text);
    }
    prism_device_profile p;
    memset(&p, 0, sizeof p);
    p.device = PRISM_PROFILE_DEVICE_CPU;
    prism_status s = PRISM_OK;
    static const char *const keys[] = {"device_class", "device_name", "memory_bytes", "bf16_ops_per_second",
                                       "fp16_ops_per_second", "int8_ops_per_second", "fp8_ops_per_second",
                                       "quantize_cost", "cast_cost", "h2d_bytes_per_second", NULL};
    bool class_given = false, name_given = false;
    if (!json_is_object(root))
        s = prism_error_set(err, PRISM_ERR_INVALID, "the file: expected an object, got %s", prism_json_kind(root));
    if (!s)
        s = only_keys(root, "", keys, err);
    if (!s)
        s = get_text(root, "device_class", p.device_class, sizeof p.device_class, &class_given, err);
    if (!s && class_given && !class_ok(p.device_class))
        s = prism_error_set(err, PRISM_ERR_INVALID, "device_class: \"%.100s\" is not 1 to %d letters, digits, '-', "
                            "'_' or '.'", p.device_class, PRISM_PROFILE_CLASS_MAX - 1);
    if (!s)
        s = get_text(root, "device_name", p.device_name, sizeof p.device_name, &name_given, err);
    if (!s)
        s = get_bytes(root, "memory_bytes", &p.memory_bytes, err);
    if (!s)
        s = get_figure(root, "", "bf16_ops_per_second", &p.bf16_ops_per_second, err);
    if (!s)
        s = get_figure(root, "", "fp16_ops_per_second", &p.fp16_ops_per_second, err);
    if (!s)
        s = get_figure(root, "", "int8_ops_per_second", &p.int8_ops_per_second, err);
    if (!s)
        s = get_figure(root, "", "fp8_ops_per_second", &p.fp8_ops_per_second, err);
    if (!s)
        s = get_cost(root, "quantize_cost", &p.quantize_cost, err);
    if (!s)
        s = get_cost(root, "cast_cost", &p.cast_cost, err);
    if (!s)
        s = get_figure(root, "", "h2d_bytes_per_second", &p.h2d_bytes_per_second, err);
    json_decref(root);
    if (s)
        return s;
    if (!class_given) {
        if (device_class && device_class[0])
            snprintf(p.device_class, sizeof p.device_class, "%s", device_class);
        else
            prism_profile_device_class("gpu", p.device_name, p.device_class, sizeof p.device_class);
    }
    *out = p;
    return PRISM_OK;
}
