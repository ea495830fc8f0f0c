#define _GNU_SOURCE
#include "CSupport.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <malloc.h>
#include <string.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <sys/random.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>
#include <linux/nsfs.h>
#include <signal.h>

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

int kc_peer_credentials(int fd, kc_peer_cred *out) {
    struct ucred cred;
    memset(&cred, 0, sizeof cred);
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -1;
    out->pid = cred.pid;
    out->uid = cred.uid;
    out->gid = cred.gid;
    return 0;
}

int kc_peer_pidfd(int fd) {
    int pidfd = -1;
    socklen_t len = sizeof pidfd;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) != 0) return -1;
    return pidfd;
}

int kc_pidfd_open(int32_t pid) {
    return (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
}

int kc_namespace_parent(int nsfd) {
    int fd = ioctl(nsfd, NS_GET_PARENT);
    if (fd >= 0) (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    return fd;
}

int kc_namespace_owner(int nsfd) {
    int fd = ioctl(nsfd, NS_GET_USERNS);
    if (fd >= 0) (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    return fd;
}

#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

int kc_pidfd_send_signal(int pidfd, int sig) {
    return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
}

int kc_pidfd_exited(int pidfd) {
    struct pollfd p = { .fd = pidfd, .events = POLLIN, .revents = 0 };
    int r = poll(&p, 1, 0);
    if (r < 0) return -1;
    return r > 0 ? 1 : 0;
}

int32_t kc_pidfd_pid(int pidfd) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", pidfd);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    char line[256];
    int32_t pid = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "Pid:", 4) == 0) {
            pid = (int32_t)strtol(line + 4, NULL, 10);
            break;
        }
    }
    fclose(f);
    return pid;
}

int kc_pass_credentials(int fd) {
    int on = 1;
    return setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof on);
}

/* recvmsg() with SCM_CREDENTIALS, and with room for `fd_room` passed descriptors (0: none; the
 * kernel then discards any). The writer's pid goes to *writer_pid (0: none); the first passed
 * descriptor to *passed_fd (-1: none), any further ones are closed. */
/* Inlined into both callers, so the common one (no room for descriptors) is specialised. */
static inline __attribute__((always_inline)) long recv_from_writer(int fd, void *buf, size_t len, int32_t *writer_pid, int fd_room, int *passed_fd) {
    struct iovec iov = { .iov_base = buf, .iov_len = len };
    union {
        char bytes[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } control;
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.bytes;
    msg.msg_controllen = CMSG_SPACE(sizeof(struct ucred)) + (fd_room > 0 ? CMSG_SPACE((size_t)fd_room * sizeof(int)) : 0);
    *writer_pid = 0;
    *passed_fd = -1;
    ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n <= 0) return (long)n;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET) continue;
        if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof(struct ucred))) {
            struct ucred cred;
            memcpy(&cred, CMSG_DATA(c), sizeof cred);
            *writer_pid = cred.pid;
        } else if (c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
            size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < count; i++) {
                int got;
                memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof got);
                if (*passed_fd < 0) *passed_fd = got; else close(got);
            }
        }
    }
    return (long)n;
}

long kc_recv_from_writer(int fd, void *buf, size_t len, int32_t *writer_pid) {
    int none;
    return recv_from_writer(fd, buf, len, writer_pid, 0, &none);
}

long kc_recv_from_writer_with_fd(int fd, void *buf, size_t len, int32_t *writer_pid, int *passed_fd) {
    return recv_from_writer(fd, buf, len, writer_pid, 4, passed_fd);
}

long kc_send_with_fd(int fd, const void *buf, size_t len, int passed_fd) {
    struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
    union {
        char bytes[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.bytes;
    msg.msg_controllen = sizeof control.bytes;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &passed_fd, sizeof(int));
    return (long)sendmsg(fd, &msg, MSG_NOSIGNAL);
}

int kc_queued_bytes(int fd) {
    int n = 0;
    if (ioctl(fd, SIOCINQ, &n) != 0) return -1;
    return n;
}

int kc_is_pidfd(int fd) {
    char path[64], target[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n < 0) return 0;
    target[n] = 0;
    /* anon_inode:[pidfd] before pidfs (6.9), pidfd:[inode] since. */
    return strcmp(target, "anon_inode:[pidfd]") == 0 || strncmp(target, "pidfd:", 6) == 0;
}

long kc_getrandom(void *buf, size_t len) {
    return (long)getrandom(buf, len, 0);
}

int kc_accept_cloexec(int fd) {
    return accept4(fd, NULL, NULL, SOCK_CLOEXEC);
}

int kc_make_undumpable(void) {
    struct rlimit none = { 0, 0 };
    int core = setrlimit(RLIMIT_CORE, &none);
    int dumpable = prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);  /* the part that matters: always attempted */
    return (core == 0 && dumpable == 0) ? 0 : -1;
}

int kc_make_dumpable(void) {
    return prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
}

unsigned kc_umask_private(void) {
    return (unsigned)umask(077);
}

int kc_pipe2(int fds[2], int flags) {
    return pipe2(fds, flags);
}

long kc_get_xattr(const char *path, const char *name, void *value, size_t size, int follow_links) {
    return follow_links ? getxattr(path, name, value, size) : lgetxattr(path, name, value, size);
}

int kc_open_path_flag(void) {
    return O_PATH;
}

static volatile int kc_signal_fd = -1;

static void kc_signal_to_pipe(int sig) {
    int saved = errno;
    unsigned char byte = (unsigned char)sig;
    if (kc_signal_fd >= 0) { ssize_t r = write(kc_signal_fd, &byte, 1); (void)r; }
    errno = saved;
}

int kc_install_signal_pipe(int write_fd) {
    kc_signal_fd = write_fd;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = kc_signal_to_pipe;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    int signals[] = { SIGTERM, SIGINT, SIGHUP };
    for (unsigned i = 0; i < sizeof signals / sizeof signals[0]; i++) {
        if (sigaction(signals[i], &sa, NULL) != 0) return -1;
    }
    return 0;
}

void kc_return_large_allocations(int bytes) {
    mallopt(M_MMAP_THRESHOLD, bytes);
    mallopt(M_TRIM_THRESHOLD, bytes);
}

void kc_malloc_trim(void) {
    malloc_trim(0);
}
