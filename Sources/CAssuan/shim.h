// libassuan (GnuPG's Assuan client), as pinentry is spoken to. Wrapped once, in KeychainPrompt.
#include <assuan.h>
#include <gpg-error.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

// libassuan keeps each line it reads (a pinentry's `D <pin>` among them) in buffers it allocates
// through these hooks: every one is zeroed before it goes back to the heap.
static void *kc_assuan_malloc(size_t n) { return malloc(n ? n : 1); }

static void kc_assuan_free(void *p) {
    if (p) {
        explicit_bzero(p, malloc_usable_size(p));
        free(p);
    }
}

static void *kc_assuan_realloc(void *p, size_t n) {
    if (!p) return kc_assuan_malloc(n);
    void *q = malloc(n ? n : 1);
    if (!q) return NULL;
    size_t old = malloc_usable_size(p);
    memcpy(q, p, old < n ? old : n);
    kc_assuan_free(p);
    return q;
}

/// A new client context whose memory is zeroed when freed, with logging off (it could show a pin).
static inline gpg_error_t kc_assuan_new(assuan_context_t *ctx) {
    static struct assuan_malloc_hooks hooks = {kc_assuan_malloc, kc_assuan_realloc, kc_assuan_free};
    gpg_error_t err = assuan_new_ext(ctx, GPG_ERR_SOURCE_USER_1, &hooks, NULL, NULL);
    if (err == 0) {
        assuan_set_flag(*ctx, ASSUAN_NO_LOGGING, 1);
        assuan_begin_confidential(*ctx);
    }
    return err;
}

/// The code part of a libgpg-error value (its low 16 bits), such as GPG_ERR_CANCELED.
static inline unsigned int kc_gpg_err_code(gpg_error_t err) { return (unsigned int)gpg_err_code(err); }
