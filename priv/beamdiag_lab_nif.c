/* The native code of the sick-node lab scenarios (src/beamdiag_lab_sick.erl).
 *
 * spin/1: a plain NIF that keeps its scheduler thread busy for the given
 * milliseconds without ever yielding, as a badly written NIF does.
 * spin_yield/1: the same total work done the right way: in slices of about
 * 100 microseconds, each reported with enif_consume_timeslice, rescheduling
 * itself with enif_schedule_nif when the timeslice is used up.
 * leak_malloc/1: allocates the given bytes with malloc, touches every page
 * and never frees them, as a NIF that leaks does: the resident memory
 * grows, the VM's own accounts do not.
 *
 * Built by the lab at scenario start with gcc against the running OTP's
 * erl_nif.h; not stripped, so perf names beamdiag_lab_spin_slice. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <erl_nif.h>

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Pure arithmetic until the deadline; the clock is read once every few
 * thousand steps so that the time goes to this function, not the vDSO. */
__attribute__((noinline)) void beamdiag_lab_spin_slice(long long until_ns)
{
    volatile unsigned long acc = 1;
    do {
        for (int i = 0; i < 20000; i++)
            acc = acc * 6364136223846793005UL + 1442695040888963407UL;
    } while (now_ns() < until_ns);
}

static ERL_NIF_TERM spin(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    int ms;
    if (argc != 1 || !enif_get_int(env, argv[0], &ms) || ms < 0 || ms > 60000)
        return enif_make_badarg(env);
    beamdiag_lab_spin_slice(now_ns() + (long long)ms * 1000000LL);
    return enif_make_atom(env, "ok");
}

static ERL_NIF_TERM spin_until(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    ErlNifSInt64 until;
    if (argc != 1 || !enif_get_int64(env, argv[0], &until))
        return enif_make_badarg(env);
    while (now_ns() < until) {
        long long slice = now_ns() + 100000LL;
        beamdiag_lab_spin_slice(slice < until ? slice : until);
        /* 100 us is about a tenth of a timeslice. */
        if (enif_consume_timeslice(env, 10)) {
            ERL_NIF_TERM next = enif_make_int64(env, until);
            return enif_schedule_nif(env, "spin_yield", 0, spin_until, 1, &next);
        }
    }
    return enif_make_atom(env, "ok");
}

static ERL_NIF_TERM spin_yield(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    int ms;
    ERL_NIF_TERM until;
    if (argc != 1 || !enif_get_int(env, argv[0], &ms) || ms < 0 || ms > 60000)
        return enif_make_badarg(env);
    until = enif_make_int64(env, now_ns() + (long long)ms * 1000000LL);
    return spin_until(env, 1, &until);
}

/* The leaked blocks, chained (so that the compiler cannot drop the
 * allocation as unused). Only leak_malloc touches it, from one process. */
static void *volatile leaked = NULL;

static ERL_NIF_TERM leak_malloc(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    int bytes;
    if (argc != 1 || !enif_get_int(env, argv[0], &bytes) || bytes < 1 || bytes > (64 << 20))
        return enif_make_badarg(env);
    char *p = malloc((size_t)bytes);
    if (p == NULL)
        return enif_make_atom(env, "enomem");
    memset(p, 1, (size_t)bytes);
    if ((size_t)bytes >= sizeof(void *)) {
        *(void **)p = leaked;
        leaked = p;
    }
    return enif_make_atom(env, "ok");
}

static ErlNifFunc funcs[] = {
    {"spin", 1, spin, 0},
    {"spin_yield", 1, spin_yield, 0},
    {"leak_malloc", 1, leak_malloc, 0}
};

ERL_NIF_INIT(beamdiag_lab_nif, funcs, NULL, NULL, NULL, NULL)
