/* prismctl trace: downloads a job's binary trace (GET /v1/jobs/JOB/trace, DESIGN 4.6) to a file
 * or to stdout, streamed as it arrives, for `prismctl replay`. */
#define _POSIX_C_SOURCE 200809L
#include "prismctl.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ERROR_BODY_MAX (64u * 1024u) /* of a refusal's body, kept for its message */

typedef struct download {
    CURL *curl;
    FILE *out;
    bool refused;        /* the answer is not a 200: its body is the error, not the trace */
    bool write_failed;
    unsigned long long bytes;
    char error[ERROR_BODY_MAX + 1];
    size_t error_len;
} download;

/* libcurl's body callback: a 200's bytes go to the output, another status's to the error text. */
static size_t take(char *data, size_t size, size_t n, void *ctx)
{
    download *d = ctx;
    size_t len = size * n;
    long status = 0;
    curl_easy_getinfo(d->curl, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200) {
        d->refused = true;
        size_t keep = ERROR_BODY_MAX - d->error_len < len ? ERROR_BODY_MAX - d->error_len : len;
        memcpy(d->error + d->error_len, data, keep);
        d->error_len += keep;
        d->error[d->error_len] = '\0';
        return len;
    }
    if (fwrite(data, 1, len, d->out) != len) {
        d->write_failed = true;
        return 0; /* ends the transfer */
    }
    d->bytes += len;
    return len;
}

static void trace_usage(FILE *out)
{
    fprintf(out,
            "usage: prismctl trace JOB [--server URL] [--token TOKEN] [-o FILE]\n\n"
            "Downloads the job's binary trace (GET /v1/jobs/JOB/trace): what prismd's policy was given for\n"
            "the job, in order (merged steps, the model layout, calibration errors, config changes), as\n"
            "length-delimited prism.v1.TraceRecord messages. `prismctl replay FILE` replays it and prints\n"
            "the telemetry prismd wrote (DESIGN 4.6). prismd keeps the newest --trace-max-bytes of it.\n\n"
            "  -o, --output FILE   write the trace to FILE (written as FILE.part, renamed when complete);\n"
            "                      without it, or with -o -, the trace goes to stdout, which must not be a\n"
            "                      terminal\n"
            "  --server URL        prismd's HTTP address (also --url; a trailing '/' is dropped); default\n"
            "                      $PRISM_SERVER or http://127.0.0.1:8080\n"
            "  --token TOKEN       the job's or the admin token, default $PRISM_TOKEN (needed when prismd\n"
            "                      runs with --require-read-token)\n\n"
            "Exit status: 0 written, 1 prismd could not be reached or the file could not be written,\n"
            "2 bad usage or a refusal (unknown job, wrong token).\n");
}

/* The message of a refusal's {"error": {"message"}} body, else the body itself. */
static void print_refusal(const download *d, long status, const char *job)
{
    json_error_t jerr;
    json_t *doc = json_loads(d->error, 0, &jerr);
    const char *message = json_string_value(json_object_get(json_object_get(doc, "error"), "message"));
    if (status == 404)
        fprintf(stderr, "prismctl trace: job %s: the server answered 404: %s\n", job,
                message ? message : "not found");
    else
        fprintf(stderr, "prismctl trace: job %s: the server answered %ld: %s\n", job, status,
                message ? message : d->error_len ? d->error : "(no body)");
    json_decref(doc);
}

int prismctl_trace(int argc, char **argv)
{
    const char *server = getenv("PRISM_SERVER") ? getenv("PRISM_SERVER") : "http://127.0.0.1:8080";
    const char *token = getenv("PRISM_TOKEN");
    const char *output = NULL, *job = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **target = strcmp(a, "--server") == 0 || strcmp(a, "--url") == 0 ? &server
                              : strcmp(a, "--token") == 0                             ? &token
                              : strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0    ? &output
                                                                                      : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            trace_usage(stdout);
            return 0;
        }
        if (target) {
            if (i + 1 >= argc) {
                fprintf(stderr, "prismctl trace: %s needs a value\n", a);
                return 2;
            }
            *target = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "prismctl trace: unknown option %s (see --help)\n", a);
            return 2;
        } else if (!job) {
            job = a;
        } else {
            fprintf(stderr, "prismctl trace: one job at a time (got \"%s\" and \"%s\")\n", job, a);
            return 2;
        }
    }
    if (!job || !job[0]) {
        trace_usage(stderr);
        return 2;
    }
    if (!prismctl_job_id_valid(job)) {
        fprintf(stderr, "prismctl trace: \"%.128s%s\" is not a job id (1 to 128 letters, digits, '-', '_' or '.', "
                        "starting with a letter or digit)\n", job, strlen(job) > 128 ? "..." : "");
        return 2;
    }
    if (output && strcmp(output, "-") == 0)
        output = NULL; /* -o -: stdout */
    if (!output && isatty(STDOUT_FILENO)) {
        fprintf(stderr, "prismctl trace: the trace is binary and stdout is a terminal: redirect stdout or use -o "
                        "FILE\n");
        return 2;
    }
    char part[4096];
    FILE *out = stdout;
    if (output) {
        snprintf(part, sizeof part, "%s.part", output);
        if (!(out = fopen(part, "wb"))) {
            fprintf(stderr, "prismctl trace: cannot write %s: %s\n", part, strerror(errno));
            return 1;
        }
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    download *d = calloc(1, sizeof *d);
    int code = 1;
    if (!d || !(d->curl = curl_easy_init())) {
        fprintf(stderr, "prismctl trace: %s\n", d ? "cannot start libcurl" : "out of memory");
        goto out;
    }
    d->out = out;
    char url[4096], auth[1024];
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs/%s/trace", job);
    prismctl_url(url, sizeof url, server, path);
    struct curl_slist *headers = NULL;
    if (token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
        headers = curl_slist_append(headers, auth);
    }
    curl_easy_setopt(d->curl, CURLOPT_URL, url);
    curl_easy_setopt(d->curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(d->curl, CURLOPT_WRITEFUNCTION, take);
    curl_easy_setopt(d->curl, CURLOPT_WRITEDATA, d);
    curl_easy_setopt(d->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(d->curl, CURLOPT_CONNECTTIMEOUT, 30L);
    /* A large trace may take long: the transfer is given up only when it stalls for 60 s. */
    curl_easy_setopt(d->curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(d->curl, CURLOPT_LOW_SPEED_TIME, 60L);
    CURLcode rc = curl_easy_perform(d->curl);
    long status = 0;
    curl_easy_getinfo(d->curl, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    if (d->write_failed || (rc == CURLE_OK && status == 200 && fflush(out) != 0)) {
        fprintf(stderr, "prismctl trace: cannot write %s: %s\n", output ? part : "stdout", strerror(errno));
    } else if (rc != CURLE_OK) {
        fprintf(stderr, "prismctl trace: GET %s: %s\n", url, curl_easy_strerror(rc));
    } else if (status != 200 || d->refused) {
        print_refusal(d, status, job);
        code = status >= 400 && status < 500 ? 2 : 1;
    } else {
        code = 0;
    }
out:
    if (d && d->curl)
        curl_easy_cleanup(d->curl);
    if (output) {
        if (fclose(out) != 0 && code == 0) {
            fprintf(stderr, "prismctl trace: cannot write %s: %s\n", part, strerror(errno));
            code = 1;
        }
        if (code == 0 && rename(part, output) != 0) {
            fprintf(stderr, "prismctl trace: cannot rename %s to %s: %s\n", part, output, strerror(errno));
            code = 1;
        }
        if (code != 0)
            unlink(part);
        else
            fprintf(stderr, "prismctl trace: job %s: %llu bytes written to %s\n", job, d->bytes, output);
    }
    free(d);
    curl_global_cleanup();
    return code;
}
