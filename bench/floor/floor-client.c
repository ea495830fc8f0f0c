/*
 * floor-client: a C client that sends keychaind's own request bytes to the daemon and to floor-echo,
 * alternating the two round by round, so each daemon figure has its floor from the same run.
 *
 *   floor-client probe DAEMON_SOCKET
 *       adds the bench item (service bench.copy, account alice) when missing, copies it once, checks
 *       the secret came back, and prints the size of the daemon's answer frame (for floor-echo).
 *   floor-client run --echo SOCKET [--echo SOCKET] --daemon SOCKET [--rounds 5] [--ops 20000]
 *                    [--clients 8] [--random-of N] [--label L] [--no-throughput] [--also NAME=SOCKET …]
 *       per round: each echo's latency, the daemon's latency, each echo's throughput, the daemon's
 *       throughput (clients connections, one thread each); prints one JSON object of medians over
 *       rounds. With two echo servers (floor-echo --threads and --epoll) the floor of each figure is
 *       the better of the two (lower latency, higher throughput); both are printed too.
 *       --also NAME=SOCKET: a reference server measured the same way in every round (NAME_p50_us,
 *       NAME_ops_s), not part of the floor (floor-echo --isolation, --secure).
 *       --random-of N: every copy names a random one of N filled items (service bench.fill,
 *       accounts user0 … user<N-1>, as keychaind-bench --fill makes them); the echo gets the same bytes.
 *   floor-client copies DAEMON_SOCKET N
 *       N cached copies on one connection and nothing else (for callgrind on either server).
 *   floor-client adds DAEMON_SOCKET N [CLIENTS] [TAG]
 *       N durable adds (service bench.adds, accounts TAG-k-i) over CLIENTS connections (default 1),
 *       each waiting for its answer; checks every answer is a success and prints {"adds_s": …}
 *       (for strace and callgrind of the write path).
 *   floor-client forked SOCKET
 *       whether a server refuses a frame written by another process on an open connection: one copy
 *       answered, then a forked child writes one more copy on the same connection and exits, then
 *       the parent sends one more. Prints "refused" and exits 0 when the server ends the connection
 *       before answering both; prints "answered" and exits 1 when it answers both. (keychaind and
 *       floor-echo --isolation, --secure, --secure-epoll must refuse; the bare echoes answer.) Waits
 *       for the server's answers or the end of the connection, never for a time.
 *   floor-client durable DAEMON_SOCKET DIR [--rounds 5] [--ops 500] [--label L] [--echo SOCKET]
 *       per round: the fdatasync floors in DIR (200 B appends; one 4 KiB block rewritten), ops adds
 *       to floor-echo --durable at SOCKET (the same request bytes; with --echo), then ops adds to the
 *       daemon on one connection and ops adds over 8; prints medians over rounds and the medians of
 *       each round's adds divided by that round's floors (the floors run in this process, so on the
 *       same vCPUs as the client).
 *
 * The request is the CBOR map keychaind-bench sends, in canonical key order:
 *   {"v": 1, "id": 2, "op": "copy", "query": {"acct": …, "svce": …, "class": "genp", "r_Data": true}}
 *
 * Build: gcc -O2 -pthread -o floor-client floor-client.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char SECRET[] = "correct horse battery staple";

static void die(const char *what) {
    fprintf(stderr, "floor-client: %s\n", what);
    exit(2);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- a few CBOR heads, enough for the two requests ---- */

struct buf { unsigned char b[512]; size_t n; };

static void head(struct buf *o, int major, uint64_t v) {
    if (v < 24) { o->b[o->n++] = (unsigned char)(major << 5 | v); }
    else if (v < 256) { o->b[o->n++] = (unsigned char)(major << 5 | 24); o->b[o->n++] = (unsigned char)v; }
    else { o->b[o->n++] = (unsigned char)(major << 5 | 25); o->b[o->n++] = (unsigned char)(v >> 8); o->b[o->n++] = (unsigned char)v; }
}
static void text(struct buf *o, const char *s) {
    size_t n = strlen(s);
    head(o, 3, n);
    memcpy(o->b + o->n, s, n);
    o->n += n;
}
static void bytes(struct buf *o, const void *p, size_t n) {
    head(o, 2, n);
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

/* A whole frame (length header + body) for op with query {acct, svce, class, and r_Data or v_Data}. */
static struct buf request(int id, const char *op, const char *service, const char *account, int add) {
    struct buf o = { .n = 4 };
    head(&o, 5, 4);
    text(&o, "v"); head(&o, 0, 1);
    text(&o, "id"); head(&o, 0, (uint64_t)id);
    text(&o, "op"); text(&o, op);
    text(&o, "query");
    head(&o, 5, 4);
    text(&o, "acct"); text(&o, account);
    text(&o, "svce"); text(&o, service);
    text(&o, "class"); text(&o, "genp");
    if (add) { text(&o, "v_Data"); bytes(&o, SECRET, sizeof SECRET - 1); }
    else { text(&o, "r_Data"); o.b[o.n++] = 0xF5; }
    uint32_t len = (uint32_t)(o.n - 4);
    o.b[0] = len >> 24; o.b[1] = len >> 16; o.b[2] = len >> 8; o.b[3] = len;
    return o;
}

/* ---- connections ---- */

struct conn { int fd; int identified; size_t have; unsigned char in[65536]; };

/* A connection's first bytes go with a pidfd of this process (SCM_RIGHTS), as keychaind's clients
 * send them: on kernels without SO_PEERPIDFD the daemon answers nothing that arrived before it pinned
 * the connecting process without one (docs/protocol.md §1). Returns what sendmsg returns. */
static ssize_t send_identifying(int fd, const unsigned char *b, size_t n) {
    int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (pidfd < 0) return send(fd, b, n, MSG_NOSIGNAL);
    struct iovec iov = { .iov_base = (void *)b, .iov_len = n };
    union { char bytes[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov; msg.msg_iovlen = 1;
    msg.msg_control = control.bytes; msg.msg_controllen = sizeof control.bytes;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET; cm->cmsg_type = SCM_RIGHTS; cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &pidfd, sizeof pidfd);
    ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
    close(pidfd);
    return w;
}

static struct conn *dial(const char *path) {
    struct conn *c = calloc(1, sizeof *c);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a.sun_path) die("socket path too long");
    strcpy(a.sun_path, path);
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&a, sizeof a) != 0) {
        fprintf(stderr, "floor-client: cannot connect to %s: %s\n", path, strerror(errno));
        exit(2);
    }
    return c;
}

static void hang_up(struct conn *c) { close(c->fd); free(c); }

/* Sends one frame and reads one whole answer frame; returns its total size (header included). */
static size_t round_trip(struct conn *c, const struct buf *req) {
    size_t sent = 0;
    while (sent < req->n) {
        ssize_t w = c->identified ? send(c->fd, req->b + sent, req->n - sent, MSG_NOSIGNAL)
                                  : send_identifying(c->fd, req->b + sent, req->n - sent);
        if (w < 0) { if (errno == EINTR) continue; die("send failed"); }
        c->identified = 1;
        sent += (size_t)w;
    }
    for (;;) {
        if (c->have >= 4) {
            size_t n = (size_t)c->in[0] << 24 | (size_t)c->in[1] << 16 | (size_t)c->in[2] << 8 | c->in[3];
            if (n + 4 > sizeof c->in) die("answer frame too large");
            if (c->have >= n + 4) {
                c->have -= n + 4;
                memmove(c->in, c->in + n + 4, c->have);
                return n + 4;
            }
        }
        ssize_t r = recv(c->fd, c->in + c->have, sizeof c->in - c->have, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) die("connection closed");
        c->have += (size_t)r;
    }
}

/* ---- statistics ---- */

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double pct(double *v, size_t n, double p) {
    qsort(v, n, sizeof *v, cmp);
    size_t i = (size_t)((double)n * p);
    return v[i < n ? i : n - 1];
}

/* ---- measurements ---- */

struct frames { struct buf *f; size_t n; };

static void latency(const char *path, const struct frames *fr, int ops, double *p50, double *p99) {
    struct conn *c = dial(path);
    for (int i = 0; i < 1000 && i < ops; i++) round_trip(c, &fr->f[i % fr->n]);
    double *t = malloc(sizeof *t * (size_t)ops);
    for (int i = 0; i < ops; i++) {
        double t0 = now();
        round_trip(c, &fr->f[i % fr->n]);
        t[i] = now() - t0;
    }
    *p50 = pct(t, (size_t)ops, 0.5);
    *p99 = pct(t, (size_t)ops, 0.99);
    free(t);
    hang_up(c);
}

struct worker { const char *path; const struct frames *fr; int ops, k; };

static void *work(void *arg) {
    struct worker *w = arg;
    struct conn *c = dial(w->path);
    for (int i = 0; i < w->ops; i++) round_trip(c, &w->fr->f[(size_t)(i + w->k * 7919) % w->fr->n]);
    hang_up(c);
    return NULL;
}

static double throughput(const char *path, const struct frames *fr, int clients, int ops) {
    pthread_t t[64];
    struct worker w[64];
    if (clients > 64) clients = 64;
    double t0 = now();
    for (int k = 0; k < clients; k++) {
        w[k] = (struct worker){ path, fr, ops / clients, k };
        pthread_create(&t[k], NULL, work, &w[k]);
    }
    for (int k = 0; k < clients; k++) pthread_join(t[k], NULL);
    return (double)(clients * (ops / clients)) / (now() - t0);
}

struct adder { const char *path, *tag; int k; long ops; int check; };

/* Adds ops new items, one at a time; an answer that is not a success ends the run. */
static void *add_items(void *arg) {
    struct adder *a = arg;
    struct conn *c = dial(a->path);
    for (long i = 0; i < a->ops; i++) {
        char acct[64];
        snprintf(acct, sizeof acct, "%s-%d-%ld", a->tag, a->k, i);
        struct buf req = request((int)(i % 60000), "add", "bench.adds", acct, 1);
        size_t n = round_trip(c, &req);
        /* A success answer carries "status": 0 (the text "status" then the integer 0). */
        if (a->check && !memmem(c->in, n, "fstatus\x00", 8)) die("an add did not succeed (duplicate tag, or not registered?)");
    }
    hang_up(c);
    return NULL;
}

/* n durable adds over `clients` connections (accounts TAG-k-i); adds per second. check: every
 * answer must be a success (0 for an echo server, whose answers are filler). */
static double adds(const char *path, const char *tag, long n, int clients, int check) {
    pthread_t t[64];
    struct adder a[64];
    if (clients < 1 || clients > 64 || n < clients) die("adds: CLIENTS must be 1-64 and at most N");
    double t0 = now();
    for (int k = 0; k < clients; k++) {
        a[k] = (struct adder){ path, tag, k, n / clients, check };
        pthread_create(&t[k], NULL, add_items, &a[k]);
    }
    for (int k = 0; k < clients; k++) pthread_join(t[k], NULL);
    return (double)(clients * (n / clients)) / (now() - t0);
}

/* The durable-write floor on the disk of dir: n writes, each followed by fdatasync, per second.
 * Appends of 200 bytes (the file grows: each fdatasync also commits its size), or with overwrite the
 * same 4 KiB block of an already written file rewritten in place (what a reused write-ahead log does). */
static double fsync_floor(const char *dir, long n, int overwrite) {
    char path[4096];
    snprintf(path, sizeof path, "%s/floor-client-fsync-%d", dir, (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) die("cannot create the fsync floor's file");
    unsigned char block[4096];
    memset(block, 0x5A, sizeof block);
    size_t size = overwrite ? sizeof block : 200;
    if (overwrite && (write(fd, block, size) != (ssize_t)size || fsync(fd) != 0)) die("fsync floor: first write failed");
    double t0 = now();
    for (long i = 0; i < n; i++) {
        ssize_t w = overwrite ? pwrite(fd, block, size, 0) : write(fd, block, size);
        if (w != (ssize_t)size || fdatasync(fd) != 0) die("fsync floor: write or fdatasync failed");
    }
    double rate = (double)n / (now() - t0);
    close(fd);
    unlink(path);
    return rate;
}

static double median(double *v, int n) { return pct(v, (size_t)n, 0.5); }

static void print_num(const char *key, double v, int last) {
    printf("\"%s\": %.2f%s", key, v, last ? "" : ", ");
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc >= 3 && strcmp(argv[1], "probe") == 0) {
        struct conn *c = dial(argv[2]);
        struct buf add = request(1, "add", "bench.copy", "alice", 1);
        round_trip(c, &add); /* success, or errSecDuplicateItem when the item is there already */
        struct buf copy = request(2, "copy", "bench.copy", "alice", 0);
        size_t n = round_trip(c, &copy);
        /* The copy answer carries the secret (the connection buffer still holds the frame). */
        if (!memmem(c->in, n, SECRET, sizeof SECRET - 1)) die("the daemon's copy answer does not carry the bench secret (is floor-client registered in the bench group?)");
        printf("%zu\n", n);
        return 0;
    }
    if (argc >= 4 && strcmp(argv[1], "copies") == 0) {
        struct conn *c = dial(argv[2]);
        struct buf copy = request(2, "copy", "bench.copy", "alice", 0);
        long n = strtol(argv[3], NULL, 10);
        for (long i = 0; i < n; i++) round_trip(c, &copy);
        hang_up(c);
        return 0;
    }
    if (argc >= 3 && strcmp(argv[1], "forked") == 0) {
        struct conn *c = dial(argv[2]);
        struct buf copy = request(2, "copy", "bench.copy", "alice", 0);
        round_trip(c, &copy);
        pid_t child = fork();
        if (child < 0) die("fork failed");
        if (child == 0) { /* the other process: one frame on the inherited connection, no read */
            ssize_t w = send(c->fd, copy.b, copy.n, MSG_NOSIGNAL);
            _exit(w == (ssize_t)copy.n ? 0 : 3);
        }
        int status = 0;
        if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) die("the forked writer could not send its frame");
        /* Then the parent's own next copy. A server that took the child's frame answers both: two
           frames arrive. One that refused it ends the connection first, after at most one frame
           (keychaind says why in an error frame; the C references just close). */
        (void)send(c->fd, copy.b, copy.n, MSG_NOSIGNAL); /* EPIPE when it is closed already */
        int frames = 0;
        for (;;) {
            while (c->have >= 4) {
                size_t n = (size_t)c->in[0] << 24 | (size_t)c->in[1] << 16 | (size_t)c->in[2] << 8 | c->in[3];
                if (n + 4 > sizeof c->in) die("answer frame too large");
                if (c->have < n + 4) break;
                c->have -= n + 4;
                memmove(c->in, c->in + n + 4, c->have);
                if (++frames == 2) { printf("answered\n"); return 1; }
            }
            ssize_t r = recv(c->fd, c->in + c->have, sizeof c->in - c->have, 0);
            if (r < 0 && errno == EINTR) continue;
            if (r == 0 || (r < 0 && errno == ECONNRESET)) { printf("refused\n"); return 0; }
            if (r < 0) die("recv failed");
            c->have += (size_t)r;
        }
    }
    if (argc >= 4 && strcmp(argv[1], "adds") == 0) {
        int clients = argc >= 5 ? atoi(argv[4]) : 1;
        const char *tag = argc >= 6 ? argv[5] : "a";
        printf("{\"adds_s\": %.2f}\n", adds(argv[2], tag, strtol(argv[3], NULL, 10), clients, 1));
        return 0;
    }
    if (argc >= 4 && strcmp(argv[1], "durable") == 0) {
        /* durable DAEMON_SOCKET DIR [--rounds R] [--ops N] [--label L] [--echo SOCKET]: per round, in
         * this order, the two fdatasync floors in DIR, N adds to floor-echo --durable (with --echo),
         * N adds on one connection, N adds over 8; medians over rounds, and medians of each round's
         * adds divided by that round's floors. */
        int rounds = 5;
        long ops = 500;
        const char *label = "run", *echo = NULL;
        for (int i = 4; i + 1 < argc; i += 2) {
            if (strcmp(argv[i], "--rounds") == 0) rounds = atoi(argv[i + 1]);
            else if (strcmp(argv[i], "--ops") == 0) ops = strtol(argv[i + 1], NULL, 10);
            else if (strcmp(argv[i], "--label") == 0) label = argv[i + 1];
            else if (strcmp(argv[i], "--echo") == 0) echo = argv[i + 1];
            else die("durable: unknown option");
        }
        if (rounds < 1 || rounds > 100 || ops < 8) die("durable: sane --rounds (1-100) and --ops (8 or more)");
        double fa[100], fo[100], a1[100], a8[100], s1a[100], s8a[100], s1o[100], s8o[100], de[100], s1e[100];
        for (int r = 0; r < rounds; r++) {
            char tag[64];
            fa[r] = fsync_floor(argv[3], ops, 0);
            fo[r] = fsync_floor(argv[3], ops, 1);
            if (echo) de[r] = adds(echo, "echo", ops, 1, 0);
            snprintf(tag, sizeof tag, "%s-%d-%d-1", label, (int)getpid(), r);
            a1[r] = adds(argv[2], tag, ops, 1, 1);
            snprintf(tag, sizeof tag, "%s-%d-%d-8", label, (int)getpid(), r);
            a8[r] = adds(argv[2], tag, ops, 8, 1);
            if (echo) s1e[r] = a1[r] / de[r];
            s1a[r] = a1[r] / fa[r]; s8a[r] = a8[r] / fa[r];
            s1o[r] = a1[r] / fo[r]; s8o[r] = a8[r] / fo[r];
        }
        printf("{\"label\": \"%s\", \"rounds\": %d, \"ops\": %ld, ", label, rounds, ops);
        print_num("fsync_floor_ops_s", median(fa, rounds), 0);
        print_num("fsync_overwrite_floor_ops_s", median(fo, rounds), 0);
        print_num("add_ops_s_1", median(a1, rounds), 0);
        print_num("add_ops_s_8", median(a8, rounds), 0);
        print_num("add_ops_1_share_of_fsync_floor", median(s1a, rounds), 0);
        print_num("add_ops_8_share_of_fsync_floor", median(s8a, rounds), 0);
        print_num("add_ops_1_share_of_fsync_overwrite_floor", median(s1o, rounds), 0);
        print_num("add_ops_8_share_of_fsync_overwrite_floor", median(s8o, rounds), !echo);
        if (echo) {
            print_num("durable_echo_ops_s_1", median(de, rounds), 0);
            print_num("add_ops_1_share_of_durable_echo", median(s1e, rounds), 1);
        }
        printf("}\n");
        return 0;
    }
    if (argc < 2 || strcmp(argv[1], "run") != 0) {
        fprintf(stderr, "usage: floor-client probe SOCKET | copies SOCKET N | forked SOCKET | adds SOCKET N [CLIENTS] [TAG] | durable SOCKET DIR [--rounds R] [--ops N] [--label L] [--echo SOCKET] | run --echo SOCKET --daemon SOCKET [--rounds R] [--ops N] [--clients C] [--random-of N] [--label L] [--no-throughput]\n");
        return 2;
    }
    const char *echo[2] = { NULL, NULL }, *daemon = NULL, *label = "run";
    int echoes = 0, alsos = 0;
    const char *also_name[4], *also_path[4];
    int rounds = 5, ops = 20000, clients = 8, random_of = 0, tput = 1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--no-throughput") == 0) { tput = 0; continue; }
        if (!v) die("an option needs a value");
        if (strcmp(a, "--also") == 0) {
            const char *eq = strchr(v, '=');
            if (!eq || alsos == 4) die("--also NAME=SOCKET (at most 4)");
            also_name[alsos] = strndup(v, (size_t)(eq - v));
            also_path[alsos++] = eq + 1;
        } else if (strcmp(a, "--echo") == 0) { if (echoes == 2) die("at most two --echo"); echo[echoes++] = v; }
        else if (strcmp(a, "--daemon") == 0) daemon = v;
        else if (strcmp(a, "--rounds") == 0) rounds = atoi(v);
        else if (strcmp(a, "--ops") == 0) ops = atoi(v);
        else if (strcmp(a, "--clients") == 0) clients = atoi(v);
        else if (strcmp(a, "--random-of") == 0) random_of = atoi(v);
        else if (strcmp(a, "--label") == 0) label = v;
        else die("unknown option");
        i++;
    }
    if (!echoes || !daemon || rounds < 1 || rounds > 100 || ops < 10) die("run needs --echo and --daemon (and sane --rounds, --ops)");

    struct frames fr;
    if (random_of > 0) {
        fr.n = (size_t)ops;
        fr.f = malloc(sizeof *fr.f * fr.n);
        srand(17);
        for (size_t i = 0; i < fr.n; i++) {
            char acct[32];
            snprintf(acct, sizeof acct, "user%d", rand() % random_of);
            fr.f[i] = request(2, "copy", "bench.fill", acct, 0);
        }
    } else {
        fr.n = 1;
        fr.f = malloc(sizeof *fr.f);
        fr.f[0] = request(2, "copy", "bench.copy", "alice", 0);
    }
    double ep50[2][100], ep99[2][100], dp50[100], dp99[100], eops[2][100], dops[100];
    double ap50[4][100], ap99[4][100], aops[4][100];
    for (int r = 0; r < rounds; r++) {
        for (int e = 0; e < echoes; e++) latency(echo[e], &fr, ops, &ep50[e][r], &ep99[e][r]);
        for (int e = 0; e < alsos; e++) latency(also_path[e], &fr, ops, &ap50[e][r], &ap99[e][r]);
        latency(daemon, &fr, ops, &dp50[r], &dp99[r]);
        if (tput) {
            for (int e = 0; e < echoes; e++) eops[e][r] = throughput(echo[e], &fr, clients, ops);
            for (int e = 0; e < alsos; e++) aops[e][r] = throughput(also_path[e], &fr, clients, ops);
            dops[r] = throughput(daemon, &fr, clients, ops);
        }
    }
    /* The floor of each figure: the better echo. */
    double e50 = 1e9, e99 = 1e9, e8 = 0, m50[2], m99[2], m8[2] = { 0, 0 };
    for (int e = 0; e < echoes; e++) {
        m50[e] = median(ep50[e], rounds);
        m99[e] = median(ep99[e], rounds);
        if (tput) m8[e] = median(eops[e], rounds);
        if (m50[e] < e50) { e50 = m50[e]; e99 = m99[e]; }
        if (m8[e] > e8) e8 = m8[e];
    }
    double d50 = median(dp50, rounds);
    printf("{\"label\": \"%s\", \"rounds\": %d, \"ops\": %d, \"random_of\": %d, ", label, rounds, ops, random_of);
    print_num("echo_p50_us", e50 * 1e6, 0);
    print_num("echo_p99_us", e99 * 1e6, 0);
    for (int e = 0; e < echoes; e++) {
        char key[64];
        snprintf(key, sizeof key, "echo%d_p50_us", e + 1);
        print_num(key, m50[e] * 1e6, 0);
        if (tput) {
            snprintf(key, sizeof key, "echo%d_ops_s", e + 1);
            print_num(key, m8[e], 0);
        }
    }
    for (int e = 0; e < alsos; e++) {
        char key[96];
        snprintf(key, sizeof key, "%s_p50_us", also_name[e]);
        print_num(key, median(ap50[e], rounds) * 1e6, 0);
        if (tput) {
            snprintf(key, sizeof key, "%s_ops_s", also_name[e]);
            print_num(key, median(aops[e], rounds), 0);
        }
    }
    print_num("copy_p50_us", d50 * 1e6, 0);
    print_num("copy_p99_us", median(dp99, rounds) * 1e6, 0);
    print_num("copy_p50_ratio_to_echo", d50 / e50, !tput);
    if (tput) {
        double d8 = median(dops, rounds);
        printf("\"clients\": %d, ", clients);
        print_num("echo_ops_s", e8, 0);
        print_num("copy_ops_s", d8, 0);
        print_num("copy_ops_share_of_echo", d8 / e8, 1);
    }
    printf("}\n");
    return 0;
}
