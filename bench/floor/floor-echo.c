/*
 * floor-echo: the fastest echo server we know how to write for keychaind's framing, the floor every
 * daemon figure in scripts/bench is set beside.
 *
 *   floor-echo SOCKET REPLY_BYTES [--threads | --epoll | --isolation | --secure | --secure-epoll | --stored N DIR | --durable DIR]
 *
 * Reads frames (4-byte big-endian length, then that many bytes), and answers each complete frame with
 * one fixed frame of REPLY_BYTES bytes in all (header included): the size of the daemon's answer to
 * the same request. Pipelined frames read together are answered with one write. No parsing, no
 * allocation on the path, one read and one write per round trip.
 *
 * --threads (default): a thread per connection with blocking I/O, the same model as keychaind.
 * --epoll: one thread per online CPU, each with its own epoll set (connections dealt round robin),
 *          non-blocking sockets. Whichever is faster on a machine is the floor there; scripts/bench
 *          measures both once and reports both.
 *
 * Three reference servers, not floors: what the daemon's guarantees cost at the least, in C.
 * --isolation: --threads plus what keychaind does per request to keep apps apart: SO_PASSCRED on the
 *          listener, every read a recvmsg whose SCM_CREDENTIALS pid must be the peer's, and a poll of
 *          the peer's pidfd (taken at accept) to be sure the process still runs.
 * --secure: --isolation plus the cryptography of a cached copy: one keyed BLAKE2b of the lookup key
 *          (the blind index), two AEAD opens (the item key under the class key, the secret under the
 *          item key) with the construction keychaind seals new rows with — AES-256-GCM where the CPU
 *          has AES-NI, XChaCha20-Poly1305 otherwise — the secret copied into the reply and wiped.
 *          The class key's AES-256-GCM schedule is computed once (as keychaind keeps it beside the
 *          class key); the item key's is computed on every open, since each row has its own.
 *
 * --secure-epoll: --secure served the --epoll way (one thread per CPU, non-blocking sockets; the peer's
 *          credentials and pidfd taken at accept). Every read is still one recvmsg, its writer checked
 *          and the pidfd polled after it, as --secure does: what an event loop would save or cost
 *          keychaind once its guarantees are paid.
 *
 * --stored N DIR: --secure, but the sealed item key and secret are read from a SQLite database in DIR
 *          for every request, as an uncached keychaind copy reads them: N rows with keychaind's
 *          columns, sizes and indexes, the same SQLite settings (WAL, unix-excl, synchronous=FULL), a
 *          connection and a prepared point lookup per client, the daemon's SQL. The request's keyed
 *          BLAKE2b picks which row (keychaind's digest names the row the query asks for); the row is
 *          found through the key_ix index, its two boxes opened in place and the secret answered.
 *          Each connection holds one read transaction throughout (nothing writes meanwhile), as
 *          keychaind's pooled readers hold theirs while no write finishes.
 *          The least an uncached copy costs: no request decoding, no allocation, no copy of a column.
 *
 * --durable DIR: --threads plus, before each answer, one 4 KiB block of a file in DIR rewritten in
 *          place and fdatasync'ed (the cheapest durable write the disk allows): the floor of a durable
 *          add on one connection — a server that receives the request, makes something durable and
 *          answers. One write at a time (a mutex): not a floor for many clients, which group commit beats.
 *
 * Build: gcc -O2 -pthread -o floor-echo floor-echo.c -lsodium -lsqlite3
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
#include <poll.h>
#include <sodium.h>
#include <sqlite3.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define BUF 65536

static unsigned char *reply;
static size_t reply_len;
static int isolation, secure;
static int durable_fd = -1;
static unsigned char durable_block[4096];
static pthread_mutex_t durable_lock = PTHREAD_MUTEX_INITIALIZER;

/* --durable: the block rewritten and on disk before the answer goes out. */
static int make_durable(void) {
    pthread_mutex_lock(&durable_lock);
    int ok = pwrite(durable_fd, durable_block, sizeof durable_block, 0) == (ssize_t)sizeof durable_block
             && fdatasync(durable_fd) == 0;
    pthread_mutex_unlock(&durable_lock);
    return ok ? 0 : -1;
}

/* --secure: a sealed item key and a secret sealed under it, opened on every request, with AES-256-GCM
 * when the CPU runs it (as keychaind's new rows are sealed) and XChaCha20-Poly1305 otherwise. */
static unsigned char class_key[32], index_key[32], nonce1[24], nonce2[24], ad[32];
static unsigned char sealed_key[32 + 16], sealed_secret[28 + 16];
static int use_gcm;
static crypto_aead_aes256gcm_state class_schedule; /* with use_gcm: class_key's, made once */

/* --stored: the database, its row count and every row's uniqueness digest (the lookup key). */
static char stored_path[4096];
static long stored_rows;
static unsigned char *stored_keys;
static sqlite3 *stored_writer; /* kept open, as keychaind keeps its writer: the file stays this process's (unix-excl) */
static const char stored_select[] =
    "SELECT rowid, ref, class, item_key, key_ix, secret FROM items WHERE key_ix IN (?)"; /* keychaind's, for a data-only copy */

static int aead_decrypt(unsigned char *m, const unsigned char *c, unsigned long long clen,
                        const unsigned char *nonce, const unsigned char *key) {
    unsigned long long len;
    if (use_gcm && key == class_key)
        return crypto_aead_aes256gcm_decrypt_afternm(m, &len, NULL, c, clen, ad, sizeof ad, nonce, &class_schedule);
    return use_gcm ? crypto_aead_aes256gcm_decrypt(m, &len, NULL, c, clen, ad, sizeof ad, nonce, key)
                   : crypto_aead_xchacha20poly1305_ietf_decrypt(m, &len, NULL, c, clen, ad, sizeof ad, nonce, key);
}

static void aead_encrypt(unsigned char *c, const unsigned char *m, unsigned long long mlen,
                         const unsigned char *nonce, const unsigned char *key) {
    if (use_gcm) crypto_aead_aes256gcm_encrypt(c, NULL, m, mlen, ad, sizeof ad, NULL, nonce, key);
    else crypto_aead_xchacha20poly1305_ietf_encrypt(c, NULL, m, mlen, ad, sizeof ad, NULL, nonce, key);
}

/* Opens one stored row's two boxes (keychaind's GCM layout: the byte 2, a 12-byte nonce, ciphertext
 * and tag) and puts the secret at `out`; 0, or -1 for a row that does not open. */
static int open_stored(sqlite3_stmt *st, unsigned char *out, size_t out_len) {
    const unsigned char *k = sqlite3_column_blob(st, 3), *sec = sqlite3_column_blob(st, 5);
    int klen = sqlite3_column_bytes(st, 3), slen = sqlite3_column_bytes(st, 5);
    unsigned char item_key[32];
    unsigned long long len;
    if (!k || !sec || klen != 1 + 12 + 32 + 16 || k[0] != 2 || slen < 12 + 16 || (size_t)(slen - 28) > out_len) return -1;
    int bad = crypto_aead_aes256gcm_decrypt_afternm(item_key, &len, NULL, k + 13, (unsigned long long)klen - 13, ad, sizeof ad, k + 1, &class_schedule) != 0
              || crypto_aead_aes256gcm_decrypt(out, &len, NULL, sec + 12, (unsigned long long)slen - 12, ad, sizeof ad, sec, item_key) != 0;
    sodium_memzero(item_key, sizeof item_key);
    return bad ? -1 : 0;
}

/* A connection as keychaind opens its readers (and, with query_only off, its writer). */
static int stored_open(sqlite3 **db, int read_only) {
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW | SQLITE_OPEN_PRIVATECACHE;
    if (sqlite3_open_v2(stored_path, db, flags, "unix-excl") != SQLITE_OK) return -1;
    const char *setup = read_only
        ? "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA secure_delete=ON; PRAGMA trusted_schema=OFF; PRAGMA query_only=ON"
        : "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA secure_delete=ON; PRAGMA trusted_schema=OFF";
    return sqlite3_exec(*db, setup, NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
}

/* Makes the database: keychaind's items table and indexes, N rows of its sizes, each row's item key
 * sealed under the class key and a 32-byte secret under the item key, in one transaction. */
static int stored_fill(void) {
    sqlite3 *db = NULL;
    sqlite3_stmt *ins = NULL;
    unlink(stored_path);
    static const char schema[] =
        "CREATE TABLE items (rowid INTEGER PRIMARY KEY, ref BLOB NOT NULL UNIQUE, class INTEGER NOT NULL,"
        " agrp_ix BLOB NOT NULL, svce_ix BLOB NOT NULL, acct_ix BLOB NOT NULL, key_ix BLOB NOT NULL UNIQUE,"
        " item_key BLOB NOT NULL, attributes BLOB NOT NULL, secret BLOB NOT NULL) STRICT;"
        "CREATE INDEX items_by_group_service_account ON items(agrp_ix, svce_ix, acct_ix);";
    if (stored_open(&db, 0) != 0 || sqlite3_exec(db, schema, NULL, NULL, NULL) != SQLITE_OK
        || sqlite3_exec(db, "PRAGMA cache_size=-262144; BEGIN", NULL, NULL, NULL) != SQLITE_OK /* the fill only */
        || sqlite3_prepare_v2(db, "INSERT INTO items (ref, class, agrp_ix, svce_ix, acct_ix, key_ix, item_key, attributes, secret)"
                                  " VALUES (?, 6, ?, ?, ?, ?, ?, ?, ?)", -1, &ins, NULL) != SQLITE_OK) goto fail;
    stored_keys = malloc(32 * (size_t)stored_rows);
    unsigned char agrp[16];
    randombytes_buf(agrp, sizeof agrp);
    for (long i = 0; i < stored_rows; i++) {
        unsigned char ref[16], svce[16], acct[16], item_key[32], secret[32];
        unsigned char sealed_key[1 + 12 + 32 + 16], attributes[12 + 101 + 16], sealed_secret[12 + 32 + 16];
        unsigned char *key = stored_keys + 32 * i;
        randombytes_buf(ref, sizeof ref);
        randombytes_buf(svce, sizeof svce);
        randombytes_buf(acct, sizeof acct);
        randombytes_buf(key, 32);
        randombytes_buf(item_key, sizeof item_key);
        randombytes_buf(secret, sizeof secret);
        sealed_key[0] = 2;
        randombytes_buf(sealed_key + 1, 12);
        crypto_aead_aes256gcm_encrypt(sealed_key + 13, NULL, item_key, sizeof item_key, ad, sizeof ad, NULL, sealed_key + 1, class_key);
        randombytes_buf(sealed_secret, 12);
        crypto_aead_aes256gcm_encrypt(sealed_secret + 12, NULL, secret, sizeof secret, ad, sizeof ad, NULL, sealed_secret, item_key);
        randombytes_buf(attributes, sizeof attributes); /* sealed attributes: never opened on this path */
        sodium_memzero(item_key, sizeof item_key);
        const unsigned char *cols[] = { ref, agrp, svce, acct, key, sealed_key, attributes, sealed_secret };
        const int lens[] = { 16, 16, 16, 16, 32, sizeof sealed_key, sizeof attributes, sizeof sealed_secret };
        for (int k = 0; k < 8; k++) sqlite3_bind_blob(ins, k + 1, cols[k], lens[k], SQLITE_TRANSIENT);
        if (sqlite3_step(ins) != SQLITE_DONE || sqlite3_reset(ins) != SQLITE_OK) goto fail;
    }
    sqlite3_finalize(ins);
    ins = NULL;
    if (sqlite3_exec(db, "COMMIT; PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL) != SQLITE_OK) goto fail;
    sqlite3_exec(db, "PRAGMA cache_size=-2000; PRAGMA shrink_memory", NULL, NULL, NULL);
    stored_writer = db;
    return 0;
fail:
    fprintf(stderr, "floor-echo: cannot make %s: %s\n", stored_path, db ? sqlite3_errmsg(db) : "cannot open");
    sqlite3_finalize(ins);
    return -1;
}

struct conn {
    int fd;
    sqlite3 *db;
    sqlite3_stmt *lookup;
    pid_t pid;
    int pidfd;
    size_t have; /* bytes of an unfinished frame at the start of buf */
    unsigned char buf[BUF];
    unsigned char out[BUF];
};

/* Consumes whole frames from c->buf, fills c->out with one reply per frame; returns reply bytes,
 * or -1 for a frame that cannot fit the buffer (the connection is closed then). */
static long take_frames(struct conn *c) {
    size_t at = 0, out = 0;
    while (c->have - at >= 4) {
        const unsigned char *h = c->buf + at;
        size_t n = (size_t)h[0] << 24 | (size_t)h[1] << 16 | (size_t)h[2] << 8 | h[3];
        if (n + 4 > BUF) return -1;
        if (c->have - at < n + 4) break;
        if (out + reply_len > BUF) return -1;
        memcpy(c->out + out, reply, reply_len);
        if (stored_rows > 0) {
            unsigned char digest[32];
            uint64_t pick;
            crypto_generichash(digest, sizeof digest, h + 4, n < 64 ? n : 64, index_key, sizeof index_key);
            memcpy(&pick, digest, sizeof pick);
            sqlite3_bind_blob(c->lookup, 1, stored_keys + 32 * (pick % (uint64_t)stored_rows), 32, SQLITE_STATIC);
            int rc = sqlite3_step(c->lookup);
            /* The daemon reads every column it selects once; so does this (in place, no copy), each
             * by its type: rowid and class as integers (read as blobs, SQLite would format them as
             * text), ref and key_ix here, item_key and secret in open_stored. */
            if (rc == SQLITE_ROW) {
                (void)sqlite3_column_int64(c->lookup, 0), (void)sqlite3_column_int64(c->lookup, 2);
                (void)sqlite3_column_bytes(c->lookup, 1), (void)sqlite3_column_blob(c->lookup, 1);
                (void)sqlite3_column_bytes(c->lookup, 4), (void)sqlite3_column_blob(c->lookup, 4);
            }
            int bad = rc != SQLITE_ROW || open_stored(c->lookup, c->out + out + reply_len - 32, 32) != 0;
            sqlite3_reset(c->lookup);
            if (bad) return -1;
        } else if (secure) {
            /* The blind index of the request (its digest is what a lookup would use), then the two
             * opens; the row's associated data is fixed here, as a stored row's is. */
            unsigned char digest[32], item_key[32], secret[28];
            crypto_generichash(digest, sizeof digest, h + 4, n < 64 ? n : 64, index_key, sizeof index_key);
            if (aead_decrypt(item_key, sealed_key, sizeof sealed_key, nonce1, class_key) != 0
                || aead_decrypt(secret, sealed_secret, sizeof sealed_secret, nonce2, item_key) != 0) return -1;
            memcpy(c->out + out + reply_len - sizeof secret, secret, sizeof secret);
            sodium_memzero(item_key, sizeof item_key);
            sodium_memzero(secret, sizeof secret);
        }
        at += n + 4;
        out += reply_len;
    }
    if (at > 0) {
        memmove(c->buf, c->buf + at, c->have - at);
        c->have -= at;
    }
    return (long)out;
}

static int write_all(int fd, const unsigned char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) { /* only with --epoll; replies are small, so spin rarely */
                continue;
            }
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* A read that also says which process wrote the bytes (SCM_CREDENTIALS), as keychaind reads. */
static ssize_t recv_from_writer(struct conn *c, pid_t *writer) {
    struct iovec iov = { .iov_base = c->buf + c->have, .iov_len = BUF - c->have };
    union { char bytes[CMSG_SPACE(sizeof(struct ucred))]; struct cmsghdr align; } control;
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.bytes,
                          .msg_controllen = sizeof control.bytes };
    *writer = 0;
    ssize_t n = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC);
    if (n <= 0) return n;
    for (struct cmsghdr *m = CMSG_FIRSTHDR(&msg); m; m = CMSG_NXTHDR(&msg, m)) {
        if (m->cmsg_level == SOL_SOCKET && m->cmsg_type == SCM_CREDENTIALS) {
            struct ucred cred;
            memcpy(&cred, CMSG_DATA(m), sizeof cred);
            *writer = cred.pid;
        }
    }
    return n;
}

/* One read, as the mode reads: with isolation, a recvmsg whose writer must be the pinned peer, still
 * running (the pidfd polled after the read); *refused is set when it is not. */
static ssize_t read_request(struct conn *c, int *refused) {
    *refused = 0;
    if (!isolation) return recv(c->fd, c->buf + c->have, BUF - c->have, 0);
    pid_t writer;
    ssize_t r = recv_from_writer(c, &writer);
    if (r > 0) {
        struct pollfd p = { .fd = c->pidfd, .events = POLLIN };
        *refused = writer != c->pid || poll(&p, 1, 0) != 0; /* another writer, or the peer exited */
    }
    return r;
}

/* The peer's pid and a pidfd that pins it (0, or -1 when the peer cannot be pinned). */
static int pin_peer(struct conn *c) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    c->pidfd = -1;
    if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -1;
    c->pid = cred.pid;
    /* SO_PEERPIDFD (Linux 6.5) pins the very process that connected, as keychaind does;
     * pidfd_open right after accept on older kernels. */
    int pidfd = -1;
    len = sizeof pidfd;
    if (getsockopt(c->fd, SOL_SOCKET, 77 /* SO_PEERPIDFD */, &pidfd, &len) != 0) pidfd = (int)syscall(SYS_pidfd_open, cred.pid, 0);
    c->pidfd = pidfd;
    return pidfd < 0 ? -1 : 0;
}

static void *serve_blocking(void *arg) {
    struct conn *c = arg;
    if (isolation && pin_peer(c) != 0) goto done;
    if (stored_rows > 0
        && (stored_open(&c->db, 1) != 0
            || sqlite3_prepare_v3(c->db, stored_select, -1, SQLITE_PREPARE_PERSISTENT, &c->lookup, NULL) != SQLITE_OK
            /* One read transaction for the connection's life: nothing writes while it serves, and
             * keychaind's pooled readers keep theirs until a write finishes. */
            || sqlite3_exec(c->db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK)) {
        fprintf(stderr, "floor-echo: %s\n", c->db ? sqlite3_errmsg(c->db) : "cannot open the database");
        goto done;
    }
    for (;;) {
        int refused;
        ssize_t r = read_request(c, &refused);
        if (refused) break;
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        c->have += (size_t)r;
        long out = take_frames(c);
        if (out > 0 && durable_fd >= 0 && make_durable() < 0) break;
        if (out < 0 || (out > 0 && write_all(c->fd, c->out, (size_t)out) < 0)) break;
        if (secure) sodium_memzero(c->out, (size_t)out);
    }
done:
    sqlite3_finalize(c->lookup);
    sqlite3_close(c->db);
    if (c->pidfd > 0) close(c->pidfd);
    close(c->fd);
    free(c);
    return NULL;
}

static int listen_on(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a.sun_path) { fprintf(stderr, "floor-echo: path too long\n"); exit(2); }
    strcpy(a.sun_path, path);
    unlink(path);
    int on = 1; /* connections inherit it: every byte then carries its writer's credentials */
    if (isolation && setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0) { perror("floor-echo: SO_PASSCRED"); exit(2); }
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 1024) != 0) {
        perror("floor-echo: bind");
        exit(2);
    }
    return fd;
}

static void *epoll_loop(void *arg) {
    int ep = (int)(intptr_t)arg;
    struct epoll_event ev[64];
    for (;;) {
        int n = epoll_wait(ep, ev, 64, -1);
        if (n < 0) { if (errno == EINTR) continue; break; }
        for (int i = 0; i < n; i++) {
            struct conn *c = ev[i].data.ptr;
            int done = 0;
            for (;;) {
                int refused;
                ssize_t r = read_request(c, &refused);
                if (refused) { done = 1; break; }
                if (r < 0 && errno == EINTR) continue;
                if (r < 0 && errno == EAGAIN) break;
                if (r <= 0) { done = 1; break; }
                c->have += (size_t)r;
                long out = take_frames(c);
                if (out < 0 || (out > 0 && write_all(c->fd, c->out, (size_t)out) < 0)) { done = 1; break; }
                if (secure) sodium_memzero(c->out, (size_t)out);
                if ((size_t)r < BUF) break; /* drained: wait for the next request */
            }
            if (done) {
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                if (c->pidfd > 0) close(c->pidfd);
                close(c->fd);
                free(c);
            }
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: floor-echo SOCKET REPLY_BYTES [--threads | --epoll | --isolation | --secure | --secure-epoll | --stored N DIR | --durable DIR]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    long total = strtol(argv[2], NULL, 10);
    if (total < 5 || total > BUF / 8) { fprintf(stderr, "floor-echo: REPLY_BYTES out of range\n"); return 2; }
    int secure_epoll = argc > 3 && strcmp(argv[3], "--secure-epoll") == 0;
    int use_epoll = secure_epoll || (argc > 3 && strcmp(argv[3], "--epoll") == 0);
    if (argc > 5 && strcmp(argv[3], "--stored") == 0) {
        stored_rows = strtol(argv[4], NULL, 10);
        snprintf(stored_path, sizeof stored_path, "%s/floor-echo-stored-%d.db", argv[5], (int)getpid());
        if (stored_rows < 1 || total < 4 + 32) { fprintf(stderr, "floor-echo: --stored needs N >= 1 and a reply of 36+ bytes\n"); return 2; }
    }
    secure = secure_epoll || stored_rows > 0 || (argc > 3 && strcmp(argv[3], "--secure") == 0);
    isolation = secure || (argc > 3 && strcmp(argv[3], "--isolation") == 0);
    if (argc > 4 && strcmp(argv[3], "--durable") == 0) {
        char path[4096];
        snprintf(path, sizeof path, "%s/floor-echo-durable-%d", argv[4], (int)getpid());
        durable_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        memset(durable_block, 0x5A, sizeof durable_block);
        if (durable_fd < 0 || write(durable_fd, durable_block, sizeof durable_block) != (ssize_t)sizeof durable_block
            || fsync(durable_fd) != 0) { fprintf(stderr, "floor-echo: cannot prepare %s\n", path); return 2; }
    }
    if (secure) {
        if (sodium_init() < 0 || total < 4 + 28) { fprintf(stderr, "floor-echo: --secure needs libsodium and a reply of 32+ bytes\n"); return 2; }
        unsigned char item_key[32], secret[28];
        randombytes_buf(class_key, sizeof class_key);
        randombytes_buf(index_key, sizeof index_key);
        randombytes_buf(item_key, sizeof item_key);
        randombytes_buf(nonce1, sizeof nonce1);
        randombytes_buf(nonce2, sizeof nonce2);
        randombytes_buf(ad, sizeof ad);
        memset(secret, 0xA0, sizeof secret);
        use_gcm = crypto_aead_aes256gcm_is_available();
        if (use_gcm) crypto_aead_aes256gcm_beforenm(&class_schedule, class_key);
        aead_encrypt(sealed_key, item_key, sizeof item_key, nonce1, class_key);
        aead_encrypt(sealed_secret, secret, sizeof secret, nonce2, item_key);
        sodium_memzero(item_key, sizeof item_key);
        if (stored_rows > 0 && (!use_gcm || sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0) != SQLITE_OK || stored_fill() != 0)) {
            fprintf(stderr, "floor-echo: --stored needs AES-256-GCM (AES-NI) and a database it can make\n");
            return 2;
        }
    }
    reply_len = (size_t)total;
    reply = malloc(reply_len);
    uint32_t body = (uint32_t)(reply_len - 4);
    reply[0] = body >> 24; reply[1] = body >> 16; reply[2] = body >> 8; reply[3] = body;
    memset(reply + 4, 0xA0, reply_len - 4);
    int lfd = listen_on(argv[1]);

    int loops = 1, *eps = NULL;
    if (use_epoll) {
        loops = (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (loops < 1) loops = 1;
        eps = calloc((size_t)loops, sizeof *eps);
        for (int i = 0; i < loops; i++) {
            eps[i] = epoll_create1(EPOLL_CLOEXEC);
            pthread_t t;
            pthread_create(&t, NULL, epoll_loop, (void *)(intptr_t)eps[i]);
            pthread_detach(t);
        }
    }
    for (unsigned next = 0;; next++) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | (use_epoll ? SOCK_NONBLOCK : 0));
        if (fd < 0) continue;
        struct conn *c = calloc(1, sizeof *c);
        c->fd = fd;
        if (use_epoll) {
            if (isolation && pin_peer(c) != 0) { close(fd); free(c); continue; }
            struct epoll_event e = { .events = EPOLLIN, .data.ptr = c };
            epoll_ctl(eps[next % (unsigned)loops], EPOLL_CTL_ADD, fd, &e);
        } else {
            pthread_t t;
            pthread_attr_t attr;
            pthread_attr_init(&attr);
            pthread_attr_setstacksize(&attr, 64 * 1024);
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            if (pthread_create(&t, &attr, serve_blocking, c) != 0) { close(fd); free(c); }
            pthread_attr_destroy(&attr);
        }
    }
}
