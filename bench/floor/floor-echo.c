/*
 * floor-echo: the fastest echo server we know how to write for keychaind's framing, the floor every
 * daemon figure in scripts/bench is set beside.
 *
 *   floor-echo SOCKET REPLY_BYTES [--threads | --epoll]
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
 * Build: gcc -O2 -pthread -o floor-echo floor-echo.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define BUF 65536

static unsigned char *reply;
static size_t reply_len;

struct conn {
    int fd;
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
        at += n + 4;
        if (out + reply_len > BUF) return -1;
        memcpy(c->out + out, reply, reply_len);
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

static void *serve_blocking(void *arg) {
    struct conn *c = arg;
    for (;;) {
        ssize_t r = recv(c->fd, c->buf + c->have, BUF - c->have, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        c->have += (size_t)r;
        long out = take_frames(c);
        if (out < 0 || (out > 0 && write_all(c->fd, c->out, (size_t)out) < 0)) break;
    }
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
                ssize_t r = recv(c->fd, c->buf + c->have, BUF - c->have, 0);
                if (r < 0 && errno == EINTR) continue;
                if (r < 0 && errno == EAGAIN) break;
                if (r <= 0) { done = 1; break; }
                c->have += (size_t)r;
                long out = take_frames(c);
                if (out < 0 || (out > 0 && write_all(c->fd, c->out, (size_t)out) < 0)) { done = 1; break; }
                if ((size_t)r < BUF) break; /* drained: wait for the next request */
            }
            if (done) {
                epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                free(c);
            }
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: floor-echo SOCKET REPLY_BYTES [--threads | --epoll]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    long total = strtol(argv[2], NULL, 10);
    if (total < 5 || total > BUF / 8) { fprintf(stderr, "floor-echo: REPLY_BYTES out of range\n"); return 2; }
    int use_epoll = argc > 3 && strcmp(argv[3], "--epoll") == 0;
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
