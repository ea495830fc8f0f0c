#ifndef KEYCHAIND_CGCRYPT_SHIM_H
#define KEYCHAIND_CGCRYPT_SHIM_H
/* libgcrypt (Debian's libgcrypt20-dev): the Secret Service's DH group arithmetic and AES-128-CBC,
 * which libsodium does not offer, and AES-256-GCM where libsodium cannot run it (no AES-NI).
 * gcry_control is variadic, so its start-up calls are made here. */
/* Packages build with -D_FORTIFY_SOURCE: its inline wrappers of libc functions (realpath, read…) would
 * be defined here and in Swift's Glibc module, and the two definitions clash. Only the declarations
 * are needed here; the C these headers declare is compiled elsewhere, fortified. */
#undef _FORTIFY_SOURCE
#include <gcrypt.h>

/* Initialises libgcrypt once, before any other thread uses it: secure memory (locked, wiped on
 * free) for secret MPIs and cipher contexts, without its warnings on stderr when mlock is refused.
 * Returns 0, or -1 when the library is older than the headers. */
static inline int kc_gcrypt_init(void) {
    if (gcry_control(GCRYCTL_INITIALIZATION_FINISHED_P)) return 0;
    if (!gcry_check_version(GCRYPT_VERSION)) return -1;
    gcry_control(GCRYCTL_SUSPEND_SECMEM_WARN);
    gcry_control(GCRYCTL_INIT_SECMEM, 65536, 0);
    /* A GCM context takes about 2 KiB of it: grow the pool rather than fail under many connections. */
    gcry_control(GCRYCTL_AUTO_EXPAND_SECMEM, 65536);
    gcry_control(GCRYCTL_RESUME_SECMEM_WARN);
    gcry_control(GCRYCTL_DISABLE_SECMEM_WARN);
    gcry_control(GCRYCTL_INITIALIZATION_FINISHED, 0);
    return 0;
}
#endif
