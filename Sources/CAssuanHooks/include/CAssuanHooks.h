#ifndef KEYCHAIND_CASSUANHOOKS_H
#define KEYCHAIND_CASSUANHOOKS_H
/* A libassuan context whose buffers are zeroed when freed. Kept apart from the CAssuan module map
 * (which only includes assuan.h) so that no libc header with fortified inline functions is part of a
 * module: with -D_FORTIFY_SOURCE (the Debian package's build) clang then refuses two definitions of
 * them. This header includes nothing: the context travels as a void pointer. */

/* assuan_new_ext() with allocation hooks that zero every buffer before freeing it (libassuan keeps
 * each line it reads, a pinentry's `D <pin>` among them, in such buffers), then logging off and
 * confidential mode on. *ctx receives the assuan_context_t; returns the gpg_error_t (0: success). */
unsigned int kc_assuan_new(void **ctx);

/* The code part of a libgpg-error value (its low 16 bits), such as GPG_ERR_CANCELED. */
unsigned int kc_gpg_err_code(unsigned int err);

#endif
