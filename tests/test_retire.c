/*
 * tests/test_retire.c -- the destroy guard of key retirement
 * (ks_rollout_destroy_guard, migrate/rollout/retire.c): every reference
 * refuses, facts not gathered refuse even when forced, force needs a
 * printable reason, and the sentences name what still references the
 * version.
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include <keyshift/rollout.h>

/* Facts for k:1 with every count gathered and zero. */
static ks_rollout_destroy_facts clean(void)
{
    ks_rollout_destroy_facts f;
    memset(&f, 0, sizeof f);
    f.key_id = "k";
    f.key_version = 1;
    f.rows_known = 1;
    f.readers_known = 1;
    return f;
}

/* Run the guard on f, check its result and, when want_why is not NULL,
 * its sentence. */
static void expect(const ks_rollout_destroy_facts *f, ks_err want, const char *want_why)
{
    char why[256];
    assert_int_equal(ks_rollout_destroy_guard(f, why, sizeof why), want);
    if (want_why != NULL)
        assert_string_equal(why, want_why);
}

/* Nothing references the version: destroy is allowed, silently. */
static void test_unreferenced(void **state)
{
    (void)state;
    ks_rollout_destroy_facts f = clean();
    expect(&f, KS_OK, "");
    f.force = 1; /* forcing what needs no force still needs a reason */
    expect(&f, KS_ERR_INVALID_ARGUMENT, "a forced destroy of k:1 needs a written reason");
    f.reason = "rotated after the incident";
    expect(&f, KS_OK, "");
}

/* Each kind of reference refuses, and the sentence lists them all. */
static void test_references(void **state)
{
    (void)state;
    ks_rollout_destroy_facts f = clean();
    f.rows = 1;
    expect(&f, KS_ERR_GUARD, "k:1 is still referenced by 1 row");
    f.rows = 12;
    f.live_readers = 2;
    expect(&f, KS_ERR_GUARD, "k:1 is still referenced by 12 rows and 2 live readers");
    f.open_rollouts = 1;
    expect(&f, KS_ERR_GUARD, "k:1 is still referenced by 12 rows, 2 live readers and 1 open rollout");
    f.rows = 0;
    expect(&f, KS_ERR_GUARD, "k:1 is still referenced by 2 live readers and 1 open rollout");
    f.live_readers = 0;
    f.open_rollouts = 3;
    expect(&f, KS_ERR_GUARD, "k:1 is still referenced by 3 open rollouts");
    f.live_readers = 1;
    f.open_rollouts = 0;
    expect(&f, KS_ERR_GUARD, "k:1 is still referenced by 1 live reader");
}

/* Force with a reason overrides references (and says so for the log),
 * never facts that were not gathered. */
static void test_force(void **state)
{
    (void)state;
    ks_rollout_destroy_facts f = clean();
    f.rows = 5;
    f.force = 1;
    f.reason = "";
    expect(&f, KS_ERR_INVALID_ARGUMENT, NULL);
    f.reason = "bad\nreason";
    expect(&f, KS_ERR_INVALID_ARGUMENT, NULL);
    f.reason = NULL;
    expect(&f, KS_ERR_INVALID_ARGUMENT, NULL);
    f.reason = "legal hold lifted, ticket 42";
    expect(&f, KS_OK, "k:1 was still referenced by 5 rows when its destroy was forced");
    /* --force with a reason also overrides facts that could not be
     * gathered (no database given): the operator takes it on, in writing */
    f.rows_known = 0;
    expect(&f, KS_OK, "the rows referencing k:1 were not checked, and its destroy was forced");
    f.rows_known = 1;
    f.readers_known = 0;
    expect(&f, KS_OK, "the live readers referencing k:1 were not checked, and its destroy was forced");
    f.rows_known = 0;
    expect(&f, KS_OK, "the rows and live readers referencing k:1 were not checked, and its destroy was forced");
}

/* Facts not gathered refuse (without --force) even with nothing counted. */
static void test_unknown(void **state)
{
    (void)state;
    ks_rollout_destroy_facts f = clean();
    f.rows_known = 0;
    expect(&f, KS_ERR_GUARD, "the rows referencing k:1 were not counted");
    f = clean();
    f.readers_known = 0;
    expect(&f, KS_ERR_GUARD, "the live readers holding k:1 were not checked");
}

/* Bad arguments: NULL facts, version 0, a key_id outside [F-KEYID-1];
 * a NULL why buffer is allowed. */
static void test_bad_arguments(void **state)
{
    (void)state;
    assert_int_equal(ks_rollout_destroy_guard(NULL, NULL, 0), KS_ERR_INVALID_ARGUMENT);
    ks_rollout_destroy_facts f = clean();
    f.key_version = 0;
    expect(&f, KS_ERR_INVALID_ARGUMENT, "");
    f = clean();
    f.key_id = "";
    expect(&f, KS_ERR_INVALID_ARGUMENT, "");
    f.key_id = NULL;
    expect(&f, KS_ERR_INVALID_ARGUMENT, "");
    f.key_id = "bad key";
    expect(&f, KS_ERR_INVALID_ARGUMENT, "");
    f = clean();
    f.key_id = "payments:kek";
    f.key_version = 4294967295u;
    f.rows = 1;
    expect(&f, KS_ERR_GUARD, "payments:kek:4294967295 is still referenced by 1 row");
    assert_int_equal(ks_rollout_destroy_guard(&f, NULL, 0), KS_ERR_GUARD);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unreferenced),  cmocka_unit_test(test_references),
        cmocka_unit_test(test_force),         cmocka_unit_test(test_unknown),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
