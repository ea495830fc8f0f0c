#include "CAssuanHooks.h"
#include <assuan.h>
#include <gpg-error.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

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

unsigned int kc_assuan_new(void **ctx) {
    static struct assuan_malloc_hooks hooks = {kc_assuan_malloc, kc_assuan_realloc, kc_assuan_free};
    assuan_context_t made = NULL;
    gpg_error_t err = assuan_new_ext(&made, GPG_ERR_SOURCE_USER_1, &hooks, NULL, NULL);
    if (err == 0) {
        assuan_set_flag(made, ASSUAN_NO_LOGGING, 1);
        assuan_begin_confidential(made);
    }
    *ctx = made;
    return err;
}

unsigned int kc_gpg_err_code(unsigned int err) { return (unsigned int)gpg_err_code(err); }
