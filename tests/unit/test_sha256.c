/* SHA-256 (client/sha256.c) against FIPS 180-4's published examples ("abc", the 448-bit two-block
 * message, one million 'a') and the 896-bit message of the NIST example set, plus every message
 * length from 0 to 199 bytes (the padding's boundaries at 55, 56 and 64 bytes among them), hashed
 * in one piece and in odd-sized pieces, checked through one digest of all their digests that
 * Python's hashlib gave:
 *
 *   h = hashlib.sha256()
 *   for n in range(200):
 *       h.update(hashlib.sha256(bytes((i * 7 + n) % 251 for i in range(n))).digest())
 *   h.hexdigest()  # 82c16aac...
 */
#include "testutil.h"

#include "sha256.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hex(const uint8_t d[PRISM_SHA256_BYTES], char out[2 * PRISM_SHA256_BYTES + 1])
{
    for (unsigned i = 0; i < PRISM_SHA256_BYTES; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void assert_digest(const uint8_t d[PRISM_SHA256_BYTES], const char *want)
{
    char got[2 * PRISM_SHA256_BYTES + 1];
    hex(d, got);
    CU_ASSERT_STRING_EQUAL(got, want);
}

static void test_sha256_fips_examples(void)
{
    static const struct {
        const char *msg;
        const char *digest;
    } cases[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t d[PRISM_SHA256_BYTES];
        prism_sha256(cases[i].msg, strlen(cases[i].msg), d);
        assert_digest(d, cases[i].digest);
    }
}

/* One million 'a', fed in pieces of 1000 (not a multiple of 64). */
static void test_sha256_one_million_a(void)
{
    char piece[1000];
    memset(piece, 'a', sizeof piece);
    prism_sha256_ctx s;
    prism_sha256_init(&s);
    for (int i = 0; i < 1000; i++)
        prism_sha256_update(&s, piece, sizeof piece);
    uint8_t d[PRISM_SHA256_BYTES];
    prism_sha256_final(&s, d);
    assert_digest(d, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void test_sha256_every_length_to_199_in_any_pieces(void)
{
    static const size_t pieces[] = {1, 3, 55, 56, 63, 64, 65, 200};
    uint8_t msg[200];
    for (size_t p = 0; p < sizeof pieces / sizeof pieces[0]; p++) {
        prism_sha256_ctx all;
        prism_sha256_init(&all);
        for (size_t n = 0; n < 200; n++) {
            for (size_t i = 0; i < n; i++)
                msg[i] = (uint8_t)((i * 7 + n) % 251);
            prism_sha256_ctx s;
            prism_sha256_init(&s);
            for (size_t off = 0; off < n; off += pieces[p])
                prism_sha256_update(&s, msg + off, n - off < pieces[p] ? n - off : pieces[p]);
            uint8_t d[PRISM_SHA256_BYTES];
            prism_sha256_final(&s, d);
            prism_sha256_update(&all, d, sizeof d);
        }
        uint8_t d[PRISM_SHA256_BYTES];
        prism_sha256_final(&all, d);
        assert_digest(d, "82c16aac7bfdd79af40a5b52df7e231737f2b8c2b9de2b8891bc7c4f3518edf0");
    }
}

static const prism_test_case cases[] = {
    {"test_sha256_fips_examples", test_sha256_fips_examples},
    {"test_sha256_one_million_a", test_sha256_one_million_a},
    {"test_sha256_every_length_to_199_in_any_pieces", test_sha256_every_length_to_199_in_any_pieces},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"sha256", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
