// libassuan (GnuPG's Assuan client), as pinentry is spoken to. Wrapped once, in KeychainPrompt; the
// context's zeroing allocation hooks are C of their own in CAssuanHooks (no libc header here).
#include <assuan.h>
#include <gpg-error.h>
