/*
 * keychaind-pam-helper: what pam_keychaind starts, as the user, detached from the login process.
 *
 *   keychaind-pam-helper unlock|passwd [--wait SECONDS] [--debug]
 *
 * Descriptor 3 is a socket (one end of an AF_UNIX socketpair, which unlike a pipe cannot be opened
 * again through /proc/<pid>/fd/3) holding the password (unlock: one line) or the old and the new password
 * (passwd: two lines). The helper waits up to SECONDS for the user's keychaind socket
 * ($XDG_RUNTIME_DIR/keychaind/keychaind.sock: systemd --user may start after the PAM session
 * module), then runs the packaged keychainctl with descriptor 3 passed on:
 *
 *   keychainctl --socket S unlock --if-locked --passphrase-fd 3
 *   keychainctl --socket S passwd --if-set --passphrase-fd 3 --new-passphrase-fd 3
 *
 * and logs the outcome to syslog (authpriv). keychainctl prints no secret, so neither does the log.
 * Nothing here ever fails a login: the login process did not wait for us.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#ifndef KEYCHAINCTL
#define KEYCHAINCTL "/usr/bin/keychainctl"
#endif

/* How long keychainctl may take once the socket is there (an unlock runs Argon2id; a socket-
 * activated daemon starts first). */
enum { COMMAND_SECONDS = 120 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int is_socket(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISSOCK(st.st_mode);
}

static int usage(void) {
    fprintf(stderr,
            "usage: keychaind-pam-helper unlock|passwd [--wait SECONDS] [--debug]\n"
            "Started by pam_keychaind(8) with the password on descriptor 3; not for use by hand.\n");
    return 2;
}

/* The first line of `s`, with control characters replaced, for one log line. */
static void one_line(char *s) {
    char *nl = strchr(s, '\n');
    if (nl != NULL) *nl = '\0';
    for (char *p = s; *p != '\0'; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
    }
}

int main(int argc, char **argv) {
    /* The password waits on our socket for up to --wait seconds: keep other processes of the user
     * from attaching to us (an exec made us dumpable again) and no core file. */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    /* A clean slate: the login process may have blocked or ignored signals. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);

    if (argc < 2) return usage();
    const char *verb = argv[1];
    int is_unlock = strcmp(verb, "unlock") == 0;
    if (!is_unlock && strcmp(verb, "passwd") != 0) return usage();
    long wait_seconds = 60;
    int debug = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--debug") == 0) {
            debug = 1;
        } else if (strcmp(argv[i], "--wait") == 0 && i + 1 < argc) {
            char *end = NULL;
            wait_seconds = strtol(argv[++i], &end, 10);
            if (end == argv[i] || *end != '\0' || wait_seconds < 0 || wait_seconds > 600) return usage();
        } else {
            return usage();
        }
    }
    struct stat st;
    if (fstat(3, &st) != 0 || !S_ISSOCK(st.st_mode)) return usage();

    openlog("pam_keychaind", LOG_PID, LOG_AUTHPRIV);
    uid_t uid = getuid();
    const char *user = getenv("USER");
    if (user == NULL) user = "?";

    char runtime_default[64];
    const char *runtime = getenv("XDG_RUNTIME_DIR");
    if (runtime == NULL || runtime[0] != '/') {
        snprintf(runtime_default, sizeof runtime_default, "/run/user/%u", (unsigned)uid);
        runtime = runtime_default;
    }
    char socket_path[PATH_MAX];
    if (snprintf(socket_path, sizeof socket_path, "%s/keychaind/keychaind.sock", runtime) >= (int)sizeof socket_path) {
        syslog(LOG_WARNING, "runtime directory path too long: %s's keychain left as it is", user);
        return 0;
    }

    double deadline = now() + (double)wait_seconds;
    while (!is_socket(socket_path)) {
        if (now() >= deadline) {
            syslog(LOG_NOTICE, "no keychaind socket at %s after %ld s: %s's keychain left as it is "
                   "(systemctl --user enable --now keychaind.socket, or keychainctl %s)",
                   socket_path, wait_seconds, user, verb);
            return 0;
        }
        struct timespec quarter = { 0, 250 * 1000 * 1000 };
        nanosleep(&quarter, NULL);
    }
    if (debug) syslog(LOG_DEBUG, "socket %s is there; running keychainctl %s", socket_path, verb);

    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) {
        syslog(LOG_ERR, "pipe: %m; %s's keychain left as it is", user);
        return 0;
    }
    char *const unlock_argv[] = { "keychainctl", "--socket", socket_path, "unlock", "--if-locked",
                                  "--passphrase-fd", "3", NULL };
    char *const passwd_argv[] = { "keychainctl", "--socket", socket_path, "passwd", "--if-set",
                                  "--passphrase-fd", "3", "--new-passphrase-fd", "3", NULL };
    pid_t child = fork();
    if (child == 0) {
        /* stdout and stderr to our pipe; descriptor 3 (the password) is inherited as it is. */
        if (dup2(out[1], 1) < 0 || dup2(out[1], 2) < 0) _exit(127);
        execve(KEYCHAINCTL, is_unlock ? unlock_argv : passwd_argv, environ);
        _exit(127);
    }
    close(out[1]);
    close(3);  /* keychainctl holds the password now; we never read it */
    if (child < 0) {
        syslog(LOG_ERR, "fork: %m; %s's keychain left as it is", user);
        return 0;
    }

    char message[1024];
    size_t used = 0;
    double command_deadline = now() + COMMAND_SECONDS;
    int timed_out = 0;
    for (;;) {
        int left_ms = (int)((command_deadline - now()) * 1000);
        if (left_ms <= 0) {
            timed_out = 1;
            kill(child, SIGTERM);
            break;
        }
        struct pollfd p = { .fd = out[0], .events = POLLIN };
        int r = poll(&p, 1, left_ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        char chunk[512];
        ssize_t n = read(out[0], chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        size_t take = (size_t)n < sizeof message - 1 - used ? (size_t)n : sizeof message - 1 - used;
        memcpy(message + used, chunk, take);
        used += take;
    }
    message[used] = '\0';
    one_line(message);
    close(out[0]);
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {}

    if (timed_out) {
        syslog(LOG_WARNING, "keychainctl %s did not finish within %d s: %s's keychain left as it is",
               verb, COMMAND_SECONDS, user);
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        const char *what = message[0] != '\0' ? message
                         : is_unlock ? "keychain unlocked" : "keychain passphrase changed with the login password";
        syslog(LOG_INFO, "%s: %s", user, what);
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
        syslog(LOG_ERR, "cannot run %s: %s's keychain left as it is", KEYCHAINCTL, user);
    } else {
        /* errSecAuthFailed here means the login password is not the keychain passphrase. */
        syslog(LOG_WARNING, "%s: keychainctl %s failed (exit %d): %s", user, verb,
               WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status),
               message[0] != '\0' ? message : "no message");
    }
    return 0;
}
