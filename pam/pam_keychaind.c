/*
 * pam_keychaind: unlock the user's keychaind keychain with the login password at session open, and
 * change its passphrase along with the login password when the old one matched.
 *
 *   auth     optional pam_keychaind.so    hands the password to `keychainctl unlock --if-locked` at
 *                                         once when the user's keychaind socket is there and this
 *                                         process runs as root (login, sshd, a display manager's
 *                                         unlock) or as the user (a screen locker); else keeps a
 *                                         copy for the session (pam data)
 *   session  optional pam_keychaind.so    hands the kept copy to `keychainctl unlock --if-locked`
 *   password optional pam_keychaind.so    hands old and new to `keychainctl passwd --if-set`
 *
 * Options: debug, wait=SECONDS (how long the helper waits for the user's keychaind socket; default
 * 60, at most 600; 0 = do not wait).
 *
 * Rules (docs/security.md, "Unlock at login"):
 * - Never block or fail a login: problems are logged. auth, setcred and password return PAM_IGNORE
 *   (this module proves nothing, so it must never count as an authentication); session returns
 *   PAM_SUCCESS, since a session stack whose modules all ignore it fails.
 * - Never talk to the socket from here (this is login's or sshd's address space, running as root):
 *   fork, detach, drop to the user's uid and groups, and exec the helper, which waits for the socket
 *   (systemd --user may start after this module; the daemon may start by socket activation) and
 *   runs the packaged keychainctl.
 * - The password goes to the helper on one end of an AF_UNIX socketpair (descriptor 3), never argv,
 *   environment, a file or a pipe: a pipe can be opened again through /proc/<pid>/fd/3 by any
 *   process allowed to look at the holder (a process of the user, when the holder is the user's),
 *   a socket cannot (ENXIO, whoever asks). The copy kept between auth and session is wiped when it
 *   is used or when PAM ends.
 *
 * Between fork and exec the child calls only async-signal-safe functions (the login process may have
 * threads); everything it needs is prepared before the fork.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <syslog.h>
#include <unistd.h>

#define PAM_SM_AUTH
#define PAM_SM_SESSION
#define PAM_SM_PASSWORD
#include <security/pam_ext.h>
#include <security/pam_modules.h>
#include <security/pam_modutil.h>

#ifndef KEYCHAIND_PAM_HELPER
#define KEYCHAIND_PAM_HELPER "/usr/libexec/keychaind/keychaind-pam-helper"
#endif

#define EXPORT __attribute__((visibility("default")))

/* The pam data name of the password kept from auth to session. */
static const char DATA_NAME[] = "pam_keychaind_authtok";
/* Longer "passwords" are not passwords; refusing them also keeps the socket write small. */
enum { MAX_PASSWORD = 4096, MAX_GROUPS = 4096 };

struct options {
    int debug;
    int wait_seconds;
};

static struct options parse_options(pam_handle_t *pamh, int argc, const char **argv) {
    struct options o = { .debug = 0, .wait_seconds = 60 };
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "debug") == 0) {
            o.debug = 1;
        } else if (strncmp(argv[i], "wait=", 5) == 0) {
            char *end = NULL;
            errno = 0;
            long v = strtol(argv[i] + 5, &end, 10);
            if (errno != 0 || end == argv[i] + 5 || *end != '\0' || v < 0 || v > 600) {
                pam_syslog(pamh, LOG_WARNING, "ignoring option %s (wait= takes 0 to 600 seconds)", argv[i]);
            } else {
                o.wait_seconds = (int)v;
            }
        } else {
            pam_syslog(pamh, LOG_WARNING, "ignoring unknown option %s", argv[i]);
        }
    }
    return o;
}

static void wipe_string(char *s) {
    if (s != NULL) explicit_bzero(s, strlen(s));
}

static void cleanup_authtok(pam_handle_t *pamh, void *data, int error_status) {
    (void)pamh;
    (void)error_status;
    wipe_string(data);
    free(data);
}

/* A password worth handing over: present, not empty, not absurdly long, one line. */
static int usable_password(const char *p) {
    if (p == NULL || p[0] == '\0') return 0;
    size_t n = strnlen(p, MAX_PASSWORD + 1);
    if (n > MAX_PASSWORD) return 0;
    return memchr(p, '\n', n) == NULL;
}

/* The user's runtime directory as the helper gets it: PAM's XDG_RUNTIME_DIR, else /run/user/UID. */
static const char *runtime_dir(pam_handle_t *pamh, uid_t uid, char *fallback, size_t size) {
    const char *runtime = pam_getenv(pamh, "XDG_RUNTIME_DIR");
    if (runtime == NULL || runtime[0] != '/' || strlen(runtime) > PATH_MAX / 2) {
        snprintf(fallback, size, "/run/user/%u", (unsigned)uid);
        runtime = fallback;
    }
    return runtime;
}

/*
 * Starts the helper as the user, detached, with `first` (and `second`, one line each) on its
 * descriptor 3. Returns at once: the only wait is for an intermediate child that forks and exits.
 */
static void spawn_helper(pam_handle_t *pamh, const struct options *o, const char *verb,
                         const char *first, const char *second) {
    const char *user = NULL;
    if (pam_get_item(pamh, PAM_USER, (const void **)&user) != PAM_SUCCESS || user == NULL || user[0] == '\0') {
        pam_syslog(pamh, LOG_NOTICE, "no user name: keychain left as it is");
        return;
    }
    struct passwd *pw = pam_modutil_getpwnam(pamh, user);
    if (pw == NULL) {
        pam_syslog(pamh, LOG_NOTICE, "unknown user %s: keychain left as it is", user);
        return;
    }
    if (access(KEYCHAIND_PAM_HELPER, X_OK) != 0) {
        pam_syslog(pamh, LOG_ERR, "cannot run %s: %m; keychain left as it is", KEYCHAIND_PAM_HELPER);
        return;
    }
    uid_t uid = pw->pw_uid;
    gid_t gid = pw->pw_gid;
    uid_t euid = geteuid();
    int drop = euid == 0 && uid != 0;
    if (euid != 0 && (euid != uid || getuid() != uid)) {
        pam_syslog(pamh, LOG_NOTICE, "running as uid %u, not root or %s: keychain left as it is",
                   (unsigned)euid, user);
        return;
    }

    gid_t *groups = NULL;
    int ngroups = 0;
    if (drop) {
        ngroups = 64;
        for (;;) {
            gid_t *g = realloc(groups, sizeof(gid_t) * (size_t)ngroups);
            if (g == NULL) {
                free(groups);
                pam_syslog(pamh, LOG_ERR, "out of memory: keychain left as it is");
                return;
            }
            groups = g;
            int n = ngroups;
            if (getgrouplist(pw->pw_name, gid, groups, &n) >= 0) {
                ngroups = n;
                break;
            }
            if (n <= ngroups || n > MAX_GROUPS) {
                free(groups);
                pam_syslog(pamh, LOG_ERR, "cannot list the groups of %s: keychain left as it is", user);
                return;
            }
            ngroups = n;
        }
    }

    /* The environment the helper (and keychainctl) get: nothing of login's own. */
    char runtime_default[64];
    const char *runtime = runtime_dir(pamh, uid, runtime_default, sizeof runtime_default);
    char *env_home = NULL, *env_user = NULL, *env_logname = NULL, *env_runtime = NULL;
    if (asprintf(&env_home, "HOME=%s", pw->pw_dir) < 0) env_home = NULL;
    if (asprintf(&env_user, "USER=%s", pw->pw_name) < 0) env_user = NULL;
    if (asprintf(&env_logname, "LOGNAME=%s", pw->pw_name) < 0) env_logname = NULL;
    if (asprintf(&env_runtime, "XDG_RUNTIME_DIR=%s", runtime) < 0) env_runtime = NULL;
    char wait_arg[16];
    snprintf(wait_arg, sizeof wait_arg, "%d", o->wait_seconds);
    char *const helper_argv[] = { (char *)"keychaind-pam-helper", (char *)verb, (char *)"--wait", wait_arg,
                                  o->debug ? (char *)"--debug" : NULL, NULL };
    char *const helper_env[] = { (char *)"PATH=/usr/bin:/bin", env_home, env_user, env_logname, env_runtime, NULL };
    if (env_home == NULL || env_user == NULL || env_logname == NULL || env_runtime == NULL) {
        pam_syslog(pamh, LOG_ERR, "out of memory: keychain left as it is");
        goto out;
    }

    /* A socketpair, not a pipe: nobody can open it again through /proc/<pid>/fd (ENXIO). Its send
     * buffer (net.core.wmem_default, 208 KiB) takes the ≤ 8 KiB at once; MSG_DONTWAIT makes sure
     * this never blocks, MSG_NOSIGNAL that a closed peer is an error, not a SIGPIPE in login. */
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
        pam_syslog(pamh, LOG_ERR, "socketpair: %m; keychain left as it is");
        goto out;
    }
    struct iovec iov[4] = {
        { (void *)first, strlen(first) }, { (void *)"\n", 1 },
        { (void *)(second ? second : ""), second ? strlen(second) : 0 }, { (void *)"\n", second ? 1 : 0 },
    };
    size_t total = iov[0].iov_len + 1 + iov[2].iov_len + iov[3].iov_len;
    struct msghdr msg = { .msg_iov = iov, .msg_iovlen = 4 };
    ssize_t written;
    do { written = sendmsg(fds[1], &msg, MSG_DONTWAIT | MSG_NOSIGNAL); } while (written < 0 && errno == EINTR);
    close(fds[1]);  /* the reader sees the end after the password */
    if (written != (ssize_t)total) {
        close(fds[0]);
        pam_syslog(pamh, LOG_ERR, "cannot hand the password to the helper; keychain left as it is");
        goto out;
    }

    /* Reap our intermediate child ourselves, whatever the application does with SIGCHLD. */
    struct sigaction dfl = { .sa_handler = SIG_DFL }, saved;
    sigemptyset(&dfl.sa_mask);
    int restore = sigaction(SIGCHLD, &dfl, &saved) == 0;

    pid_t pid = fork();
    if (pid == 0) {
        /* Intermediate child: leave login's session and process group, then fork the helper so
         * that it is nobody's child here (login and sshd wait for their own children). */
        setsid();
        pid_t helper = fork();
        if (helper != 0) _exit(helper < 0 ? 1 : 0);
        /* The password socket becomes descriptor 3; 0, 1, 2 are /dev/null; nothing else stays. */
        int pass = fcntl(fds[0], F_DUPFD, 10);
        if (pass < 0) _exit(127);
        int null = open("/dev/null", O_RDWR);
        if (null < 0) _exit(127);
        if (dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0 || dup2(pass, 3) < 0) _exit(127);
        if (close_range(4, ~0U, 0) != 0) {
            for (int fd = 4; fd < 65536; fd++) close(fd);
        }
        if (drop) {
            if (setgroups((size_t)ngroups, groups) != 0) _exit(127);
            if (setresgid(gid, gid, gid) != 0) _exit(127);
            if (setresuid(uid, uid, uid) != 0) _exit(127);
            if (setuid(0) == 0) _exit(127);  /* must be impossible now */
        }
        execve(KEYCHAIND_PAM_HELPER, helper_argv, helper_env);
        _exit(127);
    }
    close(fds[0]);
    if (pid < 0) {
        pam_syslog(pamh, LOG_ERR, "fork: %m; keychain left as it is");
    } else {
        int status = 0;
        pid_t r;
        do { r = waitpid(pid, &status, 0); } while (r < 0 && errno == EINTR);
        if (r == pid && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            pam_syslog(pamh, LOG_ERR, "could not start %s; keychain left as it is", KEYCHAIND_PAM_HELPER);
        } else if (o->debug) {
            pam_syslog(pamh, LOG_DEBUG, "%s of %s's keychain handed to %s", verb, user, KEYCHAIND_PAM_HELPER);
        }
    }
    if (restore) sigaction(SIGCHLD, &saved, NULL);
out:
    free(groups);
    free(env_home);
    free(env_user);
    free(env_logname);
    free(env_runtime);
}

/*
 * Whether auth hands the password over at once: the process runs as root (login, sshd, a display
 * manager — whose unlock of a running session, GDM's or LightDM's, runs no session phase) or wholly
 * as the user (a screen locker, which never runs the session phase), and the user's keychaind socket
 * is there (the daemon runs, or systemd --user listens for it). A set-user-ID program started by
 * someone (sudo, su, pkexec, polkit's helper: real uid not root, effective uid root) keeps the
 * password for the session as before: authorising a command is not coming back to the session.
 */
static int unlock_at_auth(pam_handle_t *pamh) {
    const char *user = NULL;
    if (pam_get_item(pamh, PAM_USER, (const void **)&user) != PAM_SUCCESS || user == NULL || user[0] == '\0') return 0;
    struct passwd *pw = pam_modutil_getpwnam(pamh, user);
    if (pw == NULL) return 0;
    uid_t ruid = getuid(), euid = geteuid();
    int as_root = ruid == 0 && euid == 0;
    int as_user = ruid == pw->pw_uid && euid == pw->pw_uid;
    if (!as_root && !as_user) return 0;
    char runtime_default[64], socket_path[PATH_MAX];
    const char *runtime = runtime_dir(pamh, pw->pw_uid, runtime_default, sizeof runtime_default);
    if (snprintf(socket_path, sizeof socket_path, "%s/keychaind/keychaind.sock", runtime) >= (int)sizeof socket_path) return 0;
    struct stat st;
    return stat(socket_path, &st) == 0 && S_ISSOCK(st.st_mode);
}

EXPORT int pam_sm_authenticate(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct options o = parse_options(pamh, argc, argv);
    const char *password = NULL;
    if (pam_get_item(pamh, PAM_AUTHTOK, (const void **)&password) != PAM_SUCCESS || !usable_password(password)) {
        if (o.debug) pam_syslog(pamh, LOG_DEBUG, "no password to keep for the session");
        return PAM_IGNORE;
    }
    if (unlock_at_auth(pamh)) {
        /* One attempt per authentication: no copy for the session (an earlier one is wiped), so a
         * password that is not the passphrase counts once. The socket is there: no waiting. */
        pam_set_data(pamh, DATA_NAME, NULL, NULL);
        struct options now = o;
        now.wait_seconds = 0;
        spawn_helper(pamh, &now, "unlock", password, NULL);
        return PAM_IGNORE;
    }
    char *copy = strdup(password);
    if (copy == NULL) return PAM_IGNORE;
    /* Replacing an earlier copy (a second pam_authenticate) wipes it through its cleanup. */
    if (pam_set_data(pamh, DATA_NAME, copy, cleanup_authtok) != PAM_SUCCESS) cleanup_authtok(pamh, copy, 0);
    return PAM_IGNORE;
}

EXPORT int pam_sm_setcred(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)pamh, (void)flags, (void)argc, (void)argv;
    return PAM_IGNORE;
}

EXPORT int pam_sm_open_session(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)flags;
    struct options o = parse_options(pamh, argc, argv);
    const char *password = NULL;
    if (pam_get_data(pamh, DATA_NAME, (const void **)&password) != PAM_SUCCESS || password == NULL) {
        if (o.debug) pam_syslog(pamh, LOG_DEBUG, "no password from the auth phase (key or token login?): keychain left locked");
        return PAM_SUCCESS;
    }
    spawn_helper(pamh, &o, "unlock", password, NULL);
    /* Drop (and wipe, through the cleanup) our copy now that it is in the socket. */
    pam_set_data(pamh, DATA_NAME, NULL, NULL);
    return PAM_SUCCESS;
}

EXPORT int pam_sm_close_session(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    (void)pamh, (void)flags, (void)argc, (void)argv;
    return PAM_SUCCESS;
}

EXPORT int pam_sm_chauthtok(pam_handle_t *pamh, int flags, int argc, const char **argv) {
    if (!(flags & PAM_UPDATE_AUTHTOK)) return PAM_IGNORE;  /* the preliminary check: nothing to do */
    struct options o = parse_options(pamh, argc, argv);
    const char *old = NULL, *new = NULL;
    pam_get_item(pamh, PAM_OLDAUTHTOK, (const void **)&old);
    pam_get_item(pamh, PAM_AUTHTOK, (const void **)&new);
    if (!usable_password(old) || !usable_password(new)) {
        /* root setting someone's password: nobody gave the old one, so nothing can match. */
        pam_syslog(pamh, LOG_INFO, "old or new password not known here: keychain passphrase left as it is");
        return PAM_IGNORE;
    }
    if (strcmp(old, new) == 0) return PAM_IGNORE;
    spawn_helper(pamh, &o, "passwd", old, new);
    return PAM_IGNORE;
}
