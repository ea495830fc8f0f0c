/*
 * ss-bench — the same libsecret client against whichever Secret Service provider owns
 * org.freedesktop.secrets on the session bus (keychaind or GNOME Keyring), so both are measured the
 * way applications use them. Run by scripts/bench-secret-service; see docs/performance.md.
 *
 *   ss-bench setup                  stores the item the lookups read (service=bench account=alice)
 *   ss-bench latency N              one warm connection with an encrypted (DH) session: medians over
 *                                   11 batches of N/11 calls each of
 *                                     ping    org.freedesktop.DBus.Peer.Ping to the provider (one
 *                                             round trip through the bus: the D-Bus floor)
 *                                     lookup  secret_password_lookupv_sync (SearchItems, GetSecrets,
 *                                             decryption of the secret)
 *                                     store   secret_password_storev_sync replacing one item in the
 *                                             default collection
 *   ss-bench fill K                 adds K more items to the default collection
 *   ss-bench clients C N            C processes, each with its own warm connection, do N lookups
 *                                   at once: lookups per second, all together, and the clients' CPU
 *                                   time per lookup
 *   ss-bench spawn N -- CMD ARGS…   runs CMD N times, one after another: median milliseconds per run
 *
 * Every result is one line "RESULT key=value …". Build:
 *   cc -O2 -Wall -o ss-bench ss-bench.c $(pkg-config --cflags --libs libsecret-1)
 */
#include <libsecret/secret.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/wait.h>

#define BATCHES 11

static const char *EXPECTED = "bench-secret-value";

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void die(const char *what, GError *error) {
    fprintf(stderr, "ss-bench: %s: %s\n", what, error ? error->message : "failed");
    exit(1);
}

static GHashTable *attributes(const char *service, const char *account) {
    GHashTable *a = g_hash_table_new(g_str_hash, g_str_equal);
    g_hash_table_insert(a, "service", (gpointer)service);
    g_hash_table_insert(a, "account", (gpointer)account);
    return a;
}

static GDBusConnection *bus;
static GHashTable *lookup_attributes;

static void ping(void) {
    GError *error = NULL;
    GVariant *r = g_dbus_connection_call_sync(bus, "org.freedesktop.secrets", "/org/freedesktop/secrets",
                                              "org.freedesktop.DBus.Peer", "Ping", NULL, NULL,
                                              G_DBUS_CALL_FLAGS_NONE, -1, NULL, &error);
    if (!r) die("ping", error);
    g_variant_unref(r);
}

static void lookup(void) {
    GError *error = NULL;
    gchar *secret = secret_password_lookupv_sync(NULL, lookup_attributes, NULL, &error);
    if (error || !secret) die("lookup", error);
    if (strcmp(secret, EXPECTED) != 0) { fprintf(stderr, "ss-bench: lookup returned the wrong secret\n"); exit(1); }
    secret_password_free(secret);
}

static void store(void) {
    GError *error = NULL;
    GHashTable *a = attributes("bench-store", "bob");
    if (!secret_password_storev_sync(NULL, a, SECRET_COLLECTION_DEFAULT, "bench store", "replaced-each-time", NULL, &error))
        die("store", error);
    g_hash_table_unref(a);
}

/* Median per-call time in microseconds over BATCHES batches (after one batch of warm-up). */
static double time_calls(void (*call)(void), long n) {
    long per = n / BATCHES > 3 ? n / BATCHES : 3;
    double batch[BATCHES];
    for (long i = 0; i < per; i++) call();
    for (int b = 0; b < BATCHES; b++) {
        double t0 = now_us();
        for (long i = 0; i < per; i++) call();
        batch[b] = (now_us() - t0) / per;
    }
    return median(batch, BATCHES);
}

static void connect_warm(void) {
    GError *error = NULL;
    bus = g_bus_get_sync(G_BUS_TYPE_SESSION, NULL, &error);
    if (!bus) die("session bus", error);
    /* libsecret's shared SecretService proxy, with its DH transfer session opened once. */
    SecretService *service = secret_service_get_sync(SECRET_SERVICE_OPEN_SESSION, NULL, &error);
    if (!service) die("secret service", error);
    lookup_attributes = attributes("bench", "alice");
}

static int clients(int count, long n) {
    int start[2], done[2];
    if (pipe(start) || pipe(done)) { perror("pipe"); return 1; }
    for (int c = 0; c < count; c++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 1; }
        if (pid == 0) {
            close(start[1]);
            close(done[0]);
            connect_warm();               /* after fork: GLib is never used before it */
            for (int i = 0; i < 20; i++) lookup();
            char go;
            if (read(start[0], &go, 1) != 1) _exit(2);
            for (long i = 0; i < n; i++) lookup();
            double finished = now_us();
            if (write(done[1], &finished, sizeof finished) != sizeof finished) _exit(3);
            _exit(0);
        }
    }
    close(start[0]);
    close(done[1]);
    /* Every client is warm once it blocks on the start pipe; the go bytes release them together. */
    usleep(200000);
    double t0 = now_us(), last = t0;
    char go[256];
    memset(go, 1, sizeof go);
    if (write(start[1], go, (size_t)count) != count) return 1;
    for (int c = 0; c < count; c++) {
        double finished;
        if (read(done[0], &finished, sizeof finished) != sizeof finished) { fprintf(stderr, "ss-bench: a client failed\n"); return 1; }
        if (finished > last) last = finished;
    }
    int status, failed = 0;
    while (wait(&status) > 0) failed |= !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (failed) { fprintf(stderr, "ss-bench: a client failed\n"); return 1; }
    /* CPU of the client processes (with their connection set-up and warm-up), per timed lookup. */
    struct rusage r;
    getrusage(RUSAGE_CHILDREN, &r);
    double cpu_us = (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1e6 + r.ru_utime.tv_usec + r.ru_stime.tv_usec;
    printf("RESULT clients=%d lookups=%ld lookups_per_s=%.0f client_cpu_us=%.1f\n", count, count * n,
           count * n / ((last - t0) / 1e6), cpu_us / (count * n));
    return 0;
}

static int spawn(long n, char **argv) {
    double *runs = calloc((size_t)n, sizeof *runs);
    for (long i = 0; i < n; i++) {
        double t0 = now_us();
        pid_t pid = fork();
        if (pid == 0) {
            int null = open("/dev/null", O_WRONLY);
            if (null >= 0) dup2(null, 1);
            execvp(argv[0], argv);
            _exit(127);
        }
        int status;
        if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "ss-bench: %s failed\n", argv[0]);
            return 1;
        }
        runs[i] = (now_us() - t0) / 1e3;
    }
    printf("RESULT spawn_runs=%ld spawn_ms=%.2f\n", n, median(runs, (int)n));
    free(runs);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "setup") == 0) {
        GError *error = NULL;
        GHashTable *a = attributes("bench", "alice");
        if (!secret_password_storev_sync(NULL, a, SECRET_COLLECTION_DEFAULT, "bench", EXPECTED, NULL, &error))
            die("setup", error);
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "latency") == 0) {
        long n = atol(argv[2]);
        connect_warm();
        double p = time_calls(ping, n), l = time_calls(lookup, n), s = time_calls(store, n / 4);
        printf("RESULT ping_us=%.1f lookup_us=%.1f lookups_per_s=%.0f store_us=%.1f stores_per_s=%.0f\n",
               p, l, 1e6 / l, s, 1e6 / s);
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "fill") == 0) {
        GError *error = NULL;
        int k = atoi(argv[2]);
        for (int i = 0; i < k; i++) {
            char account[32];
            snprintf(account, sizeof account, "filler-%d", i);
            GHashTable *a = attributes("bench-fill", account);
            if (!secret_password_storev_sync(NULL, a, SECRET_COLLECTION_DEFAULT, "filler", "filler-secret", NULL, &error))
                die("fill", error);
            g_hash_table_unref(a);
        }
        return 0;
    }
    if (argc >= 4 && strcmp(argv[1], "clients") == 0) return clients(atoi(argv[2]), atol(argv[3]));
    if (argc >= 5 && strcmp(argv[1], "spawn") == 0 && strcmp(argv[3], "--") == 0) return spawn(atol(argv[2]), argv + 4);
    fprintf(stderr, "usage: ss-bench setup | latency N | fill K | clients C N | spawn N -- CMD [ARGS…]\n");
    return 2;
}
