#ifndef KEYCHAIND_CSUPPORT_H
#define KEYCHAIND_CSUPPORT_H
/* The few Linux calls Swift cannot reach: struct ucred, SO_PEERPIDFD, pidfd_open, prctl, accept4.
 * Each returns what the system call returns (-1 with errno set on failure); Swift wraps them once. */
#include <sys/types.h>
#include <stdint.h>
#include <stddef.h>

typedef struct {
    int32_t pid;
    uint32_t uid;
    uint32_t gid;
} kc_peer_cred;

/* getsockopt(SO_PEERCRED). */
int kc_peer_credentials(int fd, kc_peer_cred *out);
/* getsockopt(SO_PEERPIDFD): a pidfd for the process that connected; -1/ENOPROTOOPT on old kernels. */
int kc_peer_pidfd(int fd);
/* pidfd_open(pid, 0). */
int kc_pidfd_open(int32_t pid);
/* ioctl(NS_GET_PARENT): a descriptor of the parent of the namespace `nsfd` names (a user or pid namespace). */
int kc_namespace_parent(int nsfd);
/* ioctl(NS_GET_USERNS): a descriptor of the user namespace that owns the namespace `nsfd` names. */
int kc_namespace_owner(int nsfd);
/* pidfd_send_signal(pidfd, sig, NULL, 0): signals exactly the process the pidfd pins. */
int kc_pidfd_send_signal(int pidfd, int sig);
/* 1 if the process behind the pidfd has exited, 0 if it still runs, -1 on error. */
int kc_pidfd_exited(int pidfd);
/* The pid a pidfd refers to, read from /proc/self/fdinfo; -1 if gone or unknown. */
int32_t kc_pidfd_pid(int pidfd);
/* setsockopt(SO_PASSCRED, 1): the kernel then attaches the writer's credentials to what is read. */
int kc_pass_credentials(int fd);
/* recv() through recvmsg() with SCM_CREDENTIALS: reads up to `len` bytes written by one process
 * (the kernel never joins data of two writers in one read once SO_PASSCRED is set) and stores that
 * writer's pid in *writer_pid, or 0 when the data carried no credentials. Returns what recvmsg does. */
long kc_recv_from_writer(int fd, void *buf, size_t len, int32_t *writer_pid);
/* Like kc_recv_from_writer, and also the first descriptor passed with the bytes (SCM_RIGHTS) in
 * *passed_fd (close-on-exec, owned by the caller), or -1; any further passed descriptors are closed. */
long kc_recv_from_writer_with_fd(int fd, void *buf, size_t len, int32_t *writer_pid, int *passed_fd);
/* sendmsg(MSG_NOSIGNAL) of `len` bytes with `passed_fd` attached (SCM_RIGHTS); returns what sendmsg does. */
long kc_send_with_fd(int fd, const void *buf, size_t len, int passed_fd);
/* ioctl(SIOCINQ): the bytes waiting to be read on a stream socket, or -1. */
int kc_queued_bytes(int fd);
/* 1 if `fd` is a pidfd (its /proc/self/fd link names one), else 0. */
int kc_is_pidfd(int fd);
/* getrandom(buf, len, 0): bytes from the kernel's CSPRNG (blocks only until it is seeded). */
long kc_getrandom(void *buf, size_t len);
/* accept4(fd, NULL, NULL, SOCK_CLOEXEC). */
int kc_accept_cloexec(int fd);
/* prctl(PR_SET_DUMPABLE, 0) and RLIMIT_CORE = 0. */
int kc_make_undumpable(void);
/* prctl(PR_SET_DUMPABLE, 1) (RLIMIT_CORE stays as it is). */
int kc_make_dumpable(void);
/* The caller's umask set to 077; returns the old one. */
unsigned kc_umask_private(void);
/* O_PATH, which glibc declares only with _GNU_SOURCE. */
int kc_open_path_flag(void);

/* pipe2(2) (a GNU extension the Swift Glibc module does not show): 0, or -1 with errno. */
int kc_pipe2(int fds[2], int flags);

/* getxattr(2) of `name`, or lgetxattr(2) when `follow_links` is 0 (<sys/xattr.h>, which the Swift
 * Glibc module does not show): the value's size, or -1 with errno. */
long kc_get_xattr(const char *path, const char *name, void *value, size_t size, int follow_links);

/* Installs handlers for SIGTERM, SIGINT and SIGHUP that write the signal number as one byte to
 * `write_fd` (a non-blocking pipe): the self-pipe pattern, async-signal-safe in any thread. */
int kc_install_signal_pipe(int write_fd);

/* libFuzzer's driver, linked only in -sanitize=fuzzer builds (the fuzz target calls it under FUZZING). */
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));

/* mallopt(M_MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD) set to `bytes` (<malloc.h>, which the Swift
   Glibc module does not show): allocations that large are mapped for themselves and unmapped when freed. */
void kc_return_large_allocations(int bytes);
/* malloc_trim(0): the free pages of every arena given back to the system. */
void kc_malloc_trim(void);

#endif
